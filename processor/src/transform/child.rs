//! Starting an exec child with the signal state any program expects.
//!
//! The processor blocks SIGTERM and SIGINT in every thread (see [`crate::stop`]), and std's
//! `Command` passes the blocked mask on: `python3 step.py` would ignore both, and Ctrl-C or a
//! signal to the process group would not reach it. It also leaves SIGPIPE ignored, as std sets
//! it in the processor. `posix_spawnp` starts the child with an empty mask and SIGPIPE at its
//! default instead, and reports a program that cannot be run at once, as `Command` does.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::spawn::{PosixSpawnAttr, PosixSpawnFileActions, PosixSpawnFlags, posix_spawnp};
use nix::sys::signal::{SigSet, Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, pipe2};

/// A running child whose stdin and stdout are pipes to the processor; stderr is shared.
pub struct Child {
    pid: Pid,
    /// How it ended, once reaped (its pid may then belong to another process).
    ended: Option<String>,
}

/// Starts `command` (program, then arguments; the program is looked up in `PATH`) with this
/// process's environment. Returns the child and the write end of its stdin and the read end
/// of its stdout.
pub fn spawn(command: &[String]) -> std::io::Result<(Child, File, File)> {
    let c_string = |text: &[u8]| {
        CString::new(text).map_err(|_| std::io::Error::other("a NUL byte in the exec command"))
    };
    let args = command
        .iter()
        .map(|arg| c_string(arg.as_bytes()))
        .collect::<Result<Vec<_>, _>>()?;
    let Some(program) = args.first() else {
        return Err(std::io::Error::other("an empty exec command"));
    };
    let env = std::env::vars_os()
        .map(|(key, value)| {
            let mut pair = key.as_bytes().to_vec();
            pair.push(b'=');
            pair.extend_from_slice(value.as_bytes());
            c_string(&pair)
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Close-on-exec everywhere: the child keeps only the ends dup'ed onto its 0 and 1.
    let (stdin_read, stdin_write) = pipe2(OFlag::O_CLOEXEC)?;
    let (stdout_read, stdout_write) = pipe2(OFlag::O_CLOEXEC)?;
    let mut actions = PosixSpawnFileActions::init()?;
    actions.add_dup2(stdin_read.as_raw_fd(), 0)?;
    actions.add_dup2(stdout_write.as_raw_fd(), 1)?;
    let mut attr = PosixSpawnAttr::init()?;
    attr.set_sigmask(&SigSet::empty())?;
    let mut defaults = SigSet::empty();
    defaults.add(Signal::SIGPIPE);
    attr.set_sigdefault(&defaults)?;
    attr.set_flags(
        PosixSpawnFlags::POSIX_SPAWN_SETSIGMASK | PosixSpawnFlags::POSIX_SPAWN_SETSIGDEF,
    )?;
    let pid = posix_spawnp(program, &actions, &attr, &args, &env)?;
    let child = Child { pid, ended: None };
    Ok((child, File::from(stdin_write), File::from(stdout_read)))
}

impl Child {
    pub fn id(&self) -> i32 {
        self.pid.as_raw()
    }

    /// Kills it (if it still runs) and reaps it.
    pub fn kill(&mut self) {
        if self.ended.is_none() {
            let _ = kill(self.pid, Signal::SIGKILL);
            self.wait();
        }
    }

    /// Waits for it to end; how it ended.
    pub fn wait(&mut self) -> String {
        self.reap(None)
            .unwrap_or_else(|| "still running".to_owned())
    }

    /// How it ended, if it has.
    pub fn try_wait(&mut self) -> Option<String> {
        self.reap(Some(WaitPidFlag::WNOHANG))
    }

    fn reap(&mut self, flags: Option<WaitPidFlag>) -> Option<String> {
        if self.ended.is_none() {
            let ended = loop {
                match waitpid(self.pid, flags) {
                    Ok(WaitStatus::Exited(_, code)) => break format!("exit status: {code}"),
                    Ok(WaitStatus::Signaled(_, signal, _)) => break format!("killed by {signal}"),
                    Ok(WaitStatus::StillAlive) => return None,
                    Ok(_) | Err(Errno::EINTR) => {}
                    Err(error) => break format!("cannot wait for it: {error}"),
                }
            };
            self.ended = Some(ended);
        }
        self.ended.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn children_start_with_no_signal_blocked_whatever_the_processor_blocks() {
        std::thread::spawn(|| {
            let mut blocked = SigSet::empty();
            blocked.add(Signal::SIGTERM);
            blocked.thread_block().unwrap();
            let command = ["grep", "-E", "^Sig(Blk|Ign)", "/proc/self/status"].map(String::from);
            let (mut child, stdin, mut stdout) = spawn(&command).unwrap();
            drop(stdin);
            let mut status = String::new();
            stdout.read_to_string(&mut status).unwrap();
            assert_eq!(child.wait(), "exit status: 0");
            assert!(status.contains("SigBlk:\t0000000000000000"), "{status}");
            let ignored = status
                .lines()
                .find_map(|line| line.strip_prefix("SigIgn:\t"))
                .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
                .unwrap();
            let sigpipe = 1 << (Signal::SIGPIPE as i32 - 1);
            assert_eq!(ignored & sigpipe, 0, "SIGPIPE is ignored: {status}");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_program_that_does_not_exist_is_an_error_at_once() {
        let error = spawn(&["no-such-program-here".to_owned()]).err().unwrap();
        assert_eq!(error.kind(), std::io::ErrorKind::NotFound);
    }
}
