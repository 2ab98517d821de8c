//! Striped counters: a counter the hot path bumps from many threads is
//! split into [`STRIPES`] stripes, each on its own cache line; a thread
//! always updates its own stripe ([`stripe`]), readers add them up. No
//! thread waits for another, and two threads rarely share a line.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Stripes of each striped counter.
pub(crate) const STRIPES: usize = 8;

/// A value on a cache line of its own.
#[derive(Default)]
#[repr(align(64))]
pub(crate) struct Padded<T>(pub T);

thread_local! {
    /// This thread's stripe of every striped counter.
    static STRIPE: usize = {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES
    };
}

/// This thread's stripe (threads are given stripes in turn, at their
/// first use).
pub(crate) fn stripe() -> usize {
    STRIPE.with(|s| *s)
}
