//! The epoll set of one worker thread: the descriptors that wake it
//! (eventfds rung by peers and by this process, pidfds of peers), each
//! registered with a [`Token`] saying what it is.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// What a readable descriptor means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Token {
    /// The transport's own eventfd: local work queued, or shutdown.
    Kick,
    /// A doorbell of ring `id`: work posted by a peer or completed by one.
    Bell(u64),
    /// The pidfd of the peer of ring or link `id`: the peer has exited.
    Death(u64),
}

impl Token {
    fn encode(self) -> u64 {
        match self {
            Token::Kick => 0,
            Token::Bell(id) => id << 2 | 1,
            Token::Death(id) => id << 2 | 2,
        }
    }

    fn decode(v: u64) -> Token {
        match v & 3 {
            1 => Token::Bell(v >> 2),
            2 => Token::Death(v >> 2),
            _ => Token::Kick,
        }
    }
}

/// One epoll instance.
pub struct Poller {
    fd: OwnedFd,
}

impl Poller {
    /// A new, empty set.
    pub fn new() -> io::Result<Poller> {
        // SAFETY: a plain system call.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Poller { fd })
    }

    /// Watches `fd` (level-triggered, readable) as `token`. A doorbell
    /// ([`Token::Bell`]) wakes one of the threads whose sets watch it
    /// (`EPOLLEXCLUSIVE`), not all: one thread is enough to take the work,
    /// and it wakes the next if more is posted while it is busy (see
    /// [`super::worker`]). The others wake every thread: local work and
    /// shutdown, a peer's exit.
    pub fn add(&self, fd: &OwnedFd, token: Token) -> io::Result<()> {
        let exclusive = match token {
            Token::Bell(_) => libc::EPOLLEXCLUSIVE as u32,
            Token::Kick | Token::Death(_) => 0,
        };
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32 | exclusive,
            u64: token.encode(),
        };
        // SAFETY: `ev` is valid; both descriptors are open.
        let r = unsafe {
            libc::epoll_ctl(
                self.fd.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                fd.as_raw_fd(),
                &mut ev,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Stops watching `fd`. Needed before closing a descriptor whose file
    /// another process holds too: epoll forgets a file only once every
    /// descriptor of it is closed.
    pub fn remove(&self, fd: &OwnedFd) {
        // SAFETY: both descriptors are open; a descriptor not in the set
        // gives ENOENT, which is harmless.
        unsafe {
            libc::epoll_ctl(
                self.fd.as_raw_fd(),
                libc::EPOLL_CTL_DEL,
                fd.as_raw_fd(),
                std::ptr::null_mut(),
            )
        };
    }

    /// Waits until a descriptor is readable or `timeout` (`None`: no limit)
    /// passes; appends the tokens of the readable ones to `out`.
    pub fn wait(&self, timeout: Option<Duration>, out: &mut Vec<Token>) {
        const MAX: usize = 64;
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; MAX];
        let ms = timeout.map_or(-1, |t| t.as_millis().clamp(1, i32::MAX as u128) as i32);
        // SAFETY: `evs` has room for MAX events.
        let n = unsafe { libc::epoll_wait(self.fd.as_raw_fd(), evs.as_mut_ptr(), MAX as i32, ms) };
        for ev in evs.iter().take(n.max(0) as usize) {
            out.push(Token::decode(ev.u64));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::shm::sys;

    #[test]
    fn tokens_round_trip() {
        for t in [Token::Kick, Token::Bell(7), Token::Death(1 << 40)] {
            assert_eq!(Token::decode(t.encode()), t);
        }
    }

    #[test]
    fn a_signalled_eventfd_wakes_the_waiter_with_its_token() {
        let p = Poller::new().unwrap();
        let e = sys::eventfd().unwrap();
        p.add(&e, Token::Bell(3)).unwrap();
        let mut out = Vec::new();
        p.wait(Some(Duration::from_millis(1)), &mut out);
        assert!(out.is_empty());
        sys::signal(&e);
        p.wait(Some(Duration::from_secs(5)), &mut out);
        assert_eq!(out, vec![Token::Bell(3)]);
        sys::drain(&e);
        out.clear();
        p.remove(&e);
        sys::signal(&e);
        p.wait(Some(Duration::from_millis(1)), &mut out);
        assert!(out.is_empty());
    }
}
