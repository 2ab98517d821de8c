//! Fences between transports that move a registered buffer's bytes for a
//! peer and the owner unregistering it.
//!
//! A transport that reads or writes a buffer for a peer holds the buffer's
//! [`Fence`] across each non-blocking system call that touches its memory
//! ([`Fence::enter`]); it never blocks while inside. Unregistering revokes
//! the fence ([`Fence::revoke`]): later entries fail, and `revoke` returns
//! only once every call inside has left, which takes microseconds. So once
//! `unregisterLocalMemory` returns, no peer request reads or writes any byte
//! of the range, and a request that straddles the moment fails.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The fence of one registered buffer.
#[derive(Debug, Default)]
pub struct Fence {
    revoked: AtomicBool,
    inside: AtomicUsize,
}

/// Proof of being inside a fence; leaves it when dropped.
#[derive(Debug)]
pub struct Inside<'a> {
    fence: &'a Fence,
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.fence.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Fence {
    /// A fence that admits callers.
    pub fn new() -> Fence {
        Fence::default()
    }

    /// Enters the fence for one non-blocking access to the buffer; `None`
    /// once the buffer was unregistered.
    pub fn enter(&self) -> Option<Inside<'_>> {
        // SeqCst on both sides: either this caller sees `revoked`, or
        // `revoke` sees this caller inside and waits for it.
        self.inside.fetch_add(1, Ordering::SeqCst);
        let guard = Inside { fence: self };
        (!self.revoked.load(Ordering::SeqCst)).then_some(guard)
    }

    /// Refuses later entries and waits until every caller inside has left.
    pub fn revoke(&self) {
        self.revoked.store(true, Ordering::SeqCst);
        let start = Instant::now();
        let mut spins = 0u32;
        while self.inside.load(Ordering::SeqCst) != 0 {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
            if spins == 1 << 16 {
                tracing::warn!(
                    "unregister waits for a transfer inside the buffer ({:?} so far)",
                    start.elapsed()
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn entries_fail_after_revoke() {
        let f = Fence::new();
        assert!(f.enter().is_some());
        f.revoke();
        assert!(f.enter().is_none());
        assert!(f.enter().is_none());
    }

    #[test]
    fn revoke_waits_for_callers_inside() {
        let f = Arc::new(Fence::new());
        let (entered_tx, entered_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let f2 = f.clone();
        let t = std::thread::spawn(move || {
            let inside = f2.enter().expect("admitted");
            entered_tx.send(()).unwrap();
            release_rx.recv().unwrap();
            drop(inside);
            Instant::now()
        });
        entered_rx.recv().unwrap();
        let f3 = f.clone();
        let revoker = std::thread::spawn(move || {
            f3.revoke();
            Instant::now()
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !revoker.is_finished(),
            "revoke returned with a caller inside"
        );
        release_tx.send(()).unwrap();
        let left = t.join().unwrap();
        let revoked = revoker.join().unwrap();
        assert!(revoked >= left);
    }
}
