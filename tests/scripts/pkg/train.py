# Run as a module (-m pkg.train); checks that argv reaches it untouched.
import json
import os
import sys

with open(os.path.join(os.environ["MESHRUN_RUN_DIR"], f"module-{os.environ['MESHRUN_RANK']}.json"), "w") as f:
    json.dump({"argv": sys.argv[1:], "name": __name__}, f)
