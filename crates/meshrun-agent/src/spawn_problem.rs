//! What the error of starting a process says of the program: the agent
//! tells the controller, which decides from it whether another attempt
//! could start it ([`SpawnProblem::lasting`]).

use meshrun_protocol::message::SpawnProblem;

/// Only the errors that name the file itself: ENOENT (no such file, or no
/// interpreter for its `#!` line), EACCES (no permission, a folder, a
/// `noexec` mount) and ENOEXEC (not an executable format). ETXTBSY (the
/// file is being written), EAGAIN, ENOMEM and EMFILE pass.
pub fn spawn_problem(e: &std::io::Error) -> SpawnProblem {
    match e.kind() {
        std::io::ErrorKind::NotFound => SpawnProblem::NoProgram,
        std::io::ErrorKind::PermissionDenied => SpawnProblem::NotExecutable,
        _ if e.raw_os_error() == Some(nix::errno::Errno::ENOEXEC as i32) => {
            SpawnProblem::NotExecutable
        }
        _ => SpawnProblem::Other,
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn only_the_errors_that_name_the_program_itself_are_lasting() {
        let dir = tempfile::tempdir().unwrap();
        let start = |name: &str| {
            let e = std::process::Command::new(dir.path().join(name))
                .spawn()
                .expect_err("it cannot start");
            spawn_problem(&e)
        };
        assert_eq!(start("no-such-python"), SpawnProblem::NoProgram);
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "print(1)\n").unwrap();
        assert_eq!(start("plain"), SpawnProblem::NotExecutable, "no x bit");
        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(&plain, [0x7f, b'E', b'L', b'F', 0, 0, 0, 0]).unwrap();
        assert_eq!(
            start("plain"),
            SpawnProblem::NotExecutable,
            "not an executable format"
        );
        std::fs::create_dir(dir.path().join("folder")).unwrap();
        assert_eq!(start("folder"), SpawnProblem::NotExecutable);
        // What may pass, at the next attempt or the one after.
        for errno in [
            nix::errno::Errno::EAGAIN,
            nix::errno::Errno::ENOMEM,
            nix::errno::Errno::ETXTBSY,
        ] {
            let e = std::io::Error::from_raw_os_error(errno as i32);
            assert_eq!(spawn_problem(&e), SpawnProblem::Other, "{errno}");
            assert!(!spawn_problem(&e).lasting());
        }
        assert!(SpawnProblem::NoProgram.lasting() && !SpawnProblem::Other.lasting());
    }
}
