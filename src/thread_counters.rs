//! Counters written by one thread each: a [`PerThread`] gives every thread
//! that counts a block of its own, which only that thread writes (a
//! relaxed load and a relaxed store, no locked read-modify-write, no cache
//! line shared with another writer) and readers add up
//! ([`PerThread::each`]).
//!
//! A thread's block is kept after the thread exits (readers still add it)
//! and handed to the next thread that asks for one, so a `PerThread` holds
//! at most as many blocks as threads counted into it at once. A thread
//! that counts while its thread-locals are being destroyed adds to a
//! shared block with atomic adds instead.

use crate::sync;
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A block and whether a thread owns it.
struct Slot<B> {
    /// No thread owns it: the next thread that asks may take it.
    free: AtomicBool,
    block: B,
}

/// A slot a thread holds, as its thread-locals keep it.
trait Held: Send + Sync {
    /// Gives the slot up (its thread exits).
    fn release(&self);
}

impl<B: Send + Sync> Held for Slot<B> {
    fn release(&self) {
        // Pairs with the claim's `Acquire`: the next owner sees every
        // count of this one.
        self.free.store(true, Ordering::Release);
    }
}

/// The slots this thread owns, by the id of their [`PerThread`].
struct Holdings(RefCell<Vec<(u64, Arc<dyn Held>)>>);

impl Drop for Holdings {
    fn drop(&mut self) {
        LAST.with(|l| l.set((0, std::ptr::null())));
        for (_, slot) in self.0.borrow().iter() {
            slot.release();
        }
    }
}

thread_local! {
    /// The slot this thread used last: its `PerThread`'s id and the slot
    /// (a `Slot<B>` of that `PerThread`'s `B`), kept alive by `HOLDINGS`
    /// (whose drop clears this).
    static LAST: Cell<(u64, *const ())> = const { Cell::new((0, std::ptr::null())) };
    static HOLDINGS: Holdings = const { Holdings(RefCell::new(Vec::new())) };
}

/// Counters of type `B` (atomics updated through a [`Writer`]), one block
/// per counting thread.
pub(crate) struct PerThread<B> {
    /// Tells this one's slots apart in the threads' holdings.
    id: u64,
    /// Every slot handed out, owned or free.
    slots: Mutex<Vec<Arc<Slot<B>>>>,
    /// Where threads without a slot of their own count, atomically.
    shared: B,
}

impl<B: Default + Send + Sync + 'static> Default for PerThread<B> {
    fn default() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        PerThread {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            slots: Mutex::new(Vec::new()),
            shared: B::default(),
        }
    }
}

/// How a thread updates a block: its own with a load and a store, the
/// shared one with atomic adds. It stays on the thread that got it.
pub(crate) struct Writer<'a, B> {
    /// The block.
    pub block: &'a B,
    own: bool,
    _here: std::marker::PhantomData<*const ()>,
}

impl<B> Writer<'_, B> {
    /// Adds `n` to `counter`, a counter of [`Writer::block`].
    #[inline]
    pub fn add(&self, counter: &AtomicU64, n: u64) {
        if self.own {
            counter.store(
                counter.load(Ordering::Relaxed).wrapping_add(n),
                Ordering::Relaxed,
            );
        } else {
            counter.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Whether the block is this thread's alone (its fields that no
    /// reader sums may be used as the thread's own state).
    pub fn owned(&self) -> bool {
        self.own
    }
}

impl<B: Default + Send + Sync + 'static> PerThread<B> {
    /// The calling thread's writer.
    #[inline]
    pub fn writer(&self) -> Writer<'_, B> {
        let (id, slot) = LAST.with(Cell::get);
        if id != self.id {
            return self.writer_after_claim();
        }
        // SAFETY: `slot` is a `Slot<B>` of this `PerThread` (the id names
        // it, and ids are never reused) that this thread's holdings keep
        // alive while the writer lives (it cannot leave the thread, and
        // the holdings let go of a slot only at the thread's exit, or once
        // its `PerThread`, borrowed here, is dropped); `LAST` names only
        // slots in `HOLDINGS`, and is cleared before `HOLDINGS` lets them
        // go.
        let slot = unsafe { &*slot.cast::<Slot<B>>() };
        Writer {
            block: &slot.block,
            own: true,
            _here: std::marker::PhantomData,
        }
    }

    /// The writer of a thread that did not use this `PerThread` last.
    #[cold]
    #[inline(never)]
    fn writer_after_claim(&self) -> Writer<'_, B> {
        match self.claim() {
            Some(slot) => Writer {
                // SAFETY: as in `writer`: the holdings keep the slot.
                block: unsafe { &(*slot).block },
                own: true,
                _here: std::marker::PhantomData,
            },
            None => Writer {
                block: &self.shared,
                own: false,
                _here: std::marker::PhantomData,
            },
        }
    }

    /// The calling thread's slot of this `PerThread`, taken (a free one,
    /// else a new one) and recorded in its holdings if it had none; `None`
    /// once its thread-locals are being destroyed.
    #[cold]
    fn claim(&self) -> Option<*const Slot<B>> {
        HOLDINGS
            .try_with(|h| {
                let mut held = h.0.try_borrow_mut().ok()?;
                let found = held.iter().find(|(id, _)| *id == self.id);
                let slot: *const Slot<B> = match found {
                    Some((_, slot)) => Arc::as_ptr(slot).cast(),
                    None => {
                        // Slots of dropped `PerThread`s go first.
                        held.retain(|(_, slot)| Arc::strong_count(slot) > 1);
                        let slot = self.take_slot();
                        let ptr = Arc::as_ptr(&slot);
                        held.push((self.id, slot));
                        ptr
                    }
                };
                LAST.with(|l| l.set((self.id, slot.cast())));
                Some(slot)
            })
            .ok()
            .flatten()
    }

    /// A free slot, else a new one.
    fn take_slot(&self) -> Arc<Slot<B>> {
        let mut slots = sync::lock(&self.slots);
        let free = slots.iter().find(|s| {
            s.free
                .compare_exchange(true, false, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        });
        if let Some(slot) = free {
            return slot.clone();
        }
        let slot = Arc::new(Slot {
            free: AtomicBool::new(false),
            block: B::default(),
        });
        slots.push(slot.clone());
        slot
    }

    /// Runs `f` on every block (each thread's, the shared one), for a
    /// reader to add them up.
    pub fn each(&self, mut f: impl FnMut(&B)) {
        let slots: Vec<Arc<Slot<B>>> = sync::lock(&self.slots).clone();
        slots.iter().for_each(|s| f(&s.block));
        f(&self.shared);
    }

    /// Blocks handed out (owned or free).
    #[cfg(test)]
    pub fn blocks(&self) -> usize {
        sync::lock(&self.slots).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Count(AtomicU64);

    fn total(p: &PerThread<Count>) -> u64 {
        let mut sum = 0;
        p.each(|c| sum += c.0.load(Ordering::Relaxed));
        sum
    }

    #[test]
    fn counts_of_exited_threads_stay_and_their_blocks_are_reused() {
        let p = Arc::new(PerThread::<Count>::default());
        for round in 0..5u64 {
            let threads: Vec<_> = (0..4)
                .map(|_| {
                    let p = p.clone();
                    std::thread::spawn(move || {
                        for _ in 0..10_000 {
                            let w = p.writer();
                            w.add(&w.block.0, 1);
                        }
                    })
                })
                .collect();
            threads.into_iter().for_each(|t| t.join().unwrap());
            assert_eq!(total(&p), (round + 1) * 40_000);
        }
        assert!(
            p.blocks() <= 4,
            "{} blocks for 4 threads at once",
            p.blocks()
        );
    }

    #[test]
    fn a_thread_keeps_one_block_per_counter_set() {
        let (a, b) = (PerThread::<Count>::default(), PerThread::<Count>::default());
        for _ in 0..3 {
            let w = a.writer();
            w.add(&w.block.0, 1);
            let w = b.writer();
            w.add(&w.block.0, 2);
        }
        assert_eq!((total(&a), total(&b)), (3, 6));
        assert_eq!((a.blocks(), b.blocks()), (1, 1));
        assert!(a.writer().owned());
    }

    #[test]
    fn a_thread_exiting_counts_into_the_shared_block() {
        struct CountsOnExit(Arc<PerThread<Count>>);
        impl Drop for CountsOnExit {
            fn drop(&mut self) {
                let w = self.0.writer();
                w.add(&w.block.0, 1);
            }
        }
        thread_local! {
            static ON_EXIT: RefCell<Option<CountsOnExit>> = const { RefCell::new(None) };
        }
        let p = Arc::new(PerThread::<Count>::default());
        let q = p.clone();
        std::thread::spawn(move || {
            let w = q.writer();
            w.add(&w.block.0, 1);
            // Registered after HOLDINGS: destroyed before or after it, the
            // count is kept either way.
            ON_EXIT.with(|e| *e.borrow_mut() = Some(CountsOnExit(q)));
        })
        .join()
        .unwrap();
        assert_eq!(total(&p), 2);
    }
}
