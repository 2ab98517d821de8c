//! A target engine in a child process: this test binary run again for one
//! test with a variable set, which prints `READY <name> <address>` (the
//! engine's name and its first registered buffer) and then obeys lines on
//! its stdin. A test stops it (SIGSTOP: its kernel still accepts
//! connections, nobody answers), resumes it, and reads what it prints.

use std::io::{BufRead, BufReader, Lines, Write};
use std::process::{Child, ChildStdout, Command, Stdio};

pub struct ChildTarget {
    child: Child,
    out: Lines<BufReader<ChildStdout>>,
    /// The name its engine answers to.
    pub name: String,
    /// The address of its first registered buffer.
    pub first: u64,
}

impl ChildTarget {
    /// Runs test `test` of module `module` (as `module_path!()` gives it)
    /// with `var=1`, and waits for its `READY` line.
    pub fn start(module: &str, test: &str, var: &str) -> ChildTarget {
        ChildTarget::start_with(module, test, var, &[])
    }

    /// [`ChildTarget::start`] with more variables set in the child.
    pub fn start_with(module: &str, test: &str, var: &str, env: &[(&str, &str)]) -> ChildTarget {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([&super::test_path(module, test), "--exact", "--nocapture"])
            .env(var, "1")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the target");
        let out = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut t = ChildTarget {
            child,
            out,
            name: String::new(),
            first: 0,
        };
        let ready = t.line("READY ");
        let (name, first) = ready.split_once(' ').unwrap();
        t.name = name.to_string();
        t.first = first.parse().unwrap();
        t
    }

    /// The rest of the next line that holds `tag`.
    pub fn line(&mut self, tag: &str) -> String {
        self.out
            .by_ref()
            .map_while(Result::ok)
            .find_map(|l| l.find(tag).map(|at| l[at + tag.len()..].to_string()))
            .unwrap_or_else(|| panic!("the target printed no {tag:?} line"))
    }

    /// Sends one line to its stdin.
    pub fn send(&mut self, cmd: &str) {
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{cmd}").unwrap();
        stdin.flush().unwrap();
    }

    /// Sends `sig`; a SIGSTOP returns once the child is stopped.
    pub fn signal(&self, sig: libc::c_int) {
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: kill(2) on our own child, which has not been reaped.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
        if sig == libc::SIGSTOP {
            super::proc::wait_stopped(pid);
        }
    }
}

impl Drop for ChildTarget {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
