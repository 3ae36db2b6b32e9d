# Rank 0 prints one line of LONG_LINE_BYTES characters (a multi-byte one
# at every 1000th place, so a cut inside a character would show), then a
# short one.
import os

n = int(os.environ.get("LONG_LINE_BYTES", "300000"))
if os.environ["MESHRUN_RANK"] == "0":
    line = "".join("\u00e9" if i % 1000 == 999 else "a" for i in range(n))
    print(line, flush=True)
    print("after the long line", flush=True)
