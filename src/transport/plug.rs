//! Wake-ups deferred while a caller submits a batch: the transports that
//! hand work to their own threads (or to a peer's) would otherwise wake one
//! for each request. While a [`Plug`] is held on a thread, a transport may
//! note that it owes a wake-up instead of giving it ([`plugged`]); when the
//! plug is dropped, every transport it names is [flushed](Transport::flush),
//! so one wake-up serves the whole batch, and it comes before the caller's
//! submit returns.

use super::Transport;
use std::cell::Cell;
use std::sync::Arc;

thread_local! {
    /// Plugs held on this thread (a count, so that a nested one is safe).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Whether the calling thread holds a plug: a wake-up it owes may wait for
/// the plug's drop.
pub fn plugged() -> bool {
    DEPTH.with(|d| d.get() > 0)
}

/// Held while one caller's batch is handed to the transports; its drop
/// gives the wake-ups they deferred.
pub struct Plug<'a> {
    transports: &'a [Arc<dyn Transport>],
}

impl<'a> Plug<'a> {
    /// Defers the wake-ups of `transports` on this thread until the drop.
    pub fn begin(transports: &'a [Arc<dyn Transport>]) -> Plug<'a> {
        DEPTH.with(|d| d.set(d.get() + 1));
        Plug { transports }
    }
}

impl Drop for Plug<'_> {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get() - 1));
        for t in self.transports {
            t.flush();
        }
    }
}
