//! The pool of host buffers GPU memory is staged through, shared by the
//! peers of one transport: at most a fixed number of buffers, made on
//! first need, and lent by peer. A peer holds at most half of them, so
//! one that stops taking our bytes (a stopped process) cannot hold the
//! buffers the others need until it is given up on; a buffer that comes
//! back goes to the waiting peer that holds the fewest, and within a peer
//! to whoever asked first.

use super::HostBuffer;
use crate::sync;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// Called with a lent buffer, or `None` when the pool was closed first.
pub type Borrower = Box<dyn FnOnce(Option<Lent>) + Send>;

/// What one peer holds and waits for.
#[derive(Default)]
struct Share {
    held: usize,
    /// Who waits, first first, with the pool's count at their asking.
    waiters: VecDeque<(u64, Borrower)>,
}

/// What a pool holds.
struct PoolState {
    free: Vec<HostBuffer>,
    /// Buffers made so far (free or lent).
    made: usize,
    /// By peer; a peer holding none and waiting for none has no entry.
    shares: HashMap<Arc<str>, Share>,
    /// Counts the askings, to serve the longest waiting of equals first.
    asked: u64,
    /// Hands returned buffers to waiters on the pool's own thread (so
    /// whoever returns one never runs another's work).
    handoff: Option<crossbeam_channel::Sender<(Borrower, Lent)>>,
    closed: bool,
}

impl PoolState {
    /// The waiter to give a free buffer to: of the peers below `cap` that
    /// wait, the one holding the fewest (of equals, the one waiting the
    /// longest), and its first waiter.
    fn next_waiter(&mut self, cap: usize) -> Option<(Arc<str>, Borrower)> {
        let peer = self
            .shares
            .iter()
            .filter(|(_, s)| s.held < cap)
            .filter_map(|(p, s)| Some((s.held, s.waiters.front()?.0, p)))
            .min_by_key(|&(held, first, _)| (held, first))
            .map(|(_, _, p)| p.clone())?;
        let share = self.shares.get_mut(&peer)?;
        let (_, borrower) = share.waiters.pop_front()?;
        share.held += 1;
        Some((peer, borrower))
    }

    /// `peer` gave a buffer back.
    fn returned(&mut self, peer: &Arc<str>) {
        if let Some(s) = self.shares.get_mut(peer) {
            s.held -= 1;
            if s.held == 0 && s.waiters.is_empty() {
                self.shares.remove(peer);
            }
        }
    }
}

struct PoolShared {
    state: Mutex<PoolState>,
    chunk: usize,
    most: usize,
    /// The most one peer holds at once.
    cap: usize,
}

/// At most `most` host buffers of `chunk` bytes, made on first need, of
/// which one peer holds at most half.
pub struct StagingPool(Arc<PoolShared>);

/// A buffer lent by a [`StagingPool`] to a peer; it goes back when
/// dropped.
pub struct Lent {
    buffer: Option<HostBuffer>,
    peer: Arc<str>,
    pool: Arc<PoolShared>,
}

impl Lent {
    /// The buffer.
    pub fn buffer(&self) -> &HostBuffer {
        self.buffer.as_ref().expect("held until dropped")
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        let Some(buffer) = self.buffer.take() else {
            return;
        };
        let mut st = sync::lock(&self.pool.state);
        st.returned(&self.peer);
        if st.closed {
            // Freed once the lock is let go.
            drop(st);
            return;
        }
        let Some((peer, next)) = st.next_waiter(self.pool.cap) else {
            st.free.push(buffer);
            return;
        };
        let lent = Lent {
            buffer: Some(buffer),
            peer,
            pool: self.pool.clone(),
        };
        let unsent = match &st.handoff {
            Some(tx) => tx.send((next, lent)).err().map(|e| e.into_inner()),
            None => Some((next, lent)),
        };
        drop(st);
        // Without the pool's thread the waiter fails rather than waits
        // forever.
        if let Some((next, lent)) = unsent {
            drop(lent);
            next(None);
        }
    }
}

impl StagingPool {
    /// A pool of at most `most` buffers of `chunk` bytes.
    pub fn new(chunk: usize, most: usize) -> StagingPool {
        let most = most.max(1);
        StagingPool(Arc::new(PoolShared {
            state: Mutex::new(PoolState {
                free: Vec::new(),
                made: 0,
                shares: HashMap::new(),
                asked: 0,
                handoff: None,
                closed: false,
            }),
            chunk,
            most,
            cap: most.div_ceil(2),
        }))
    }

    /// Bytes in each buffer.
    pub fn chunk(&self) -> usize {
        self.0.chunk
    }

    /// Lends a buffer to `borrower`, for a transfer with `peer`: on this
    /// thread when the peer holds fewer than its half, waits for none, and
    /// a buffer is free (or may still be made, pinned for GPU `gpu`); else
    /// on the pool's thread once one comes back to it (see the module's
    /// doc for who gets it). A closed pool calls it with `None`.
    pub fn lend(&self, peer: &str, gpu: u32, borrower: Borrower) {
        let mut st = sync::lock(&self.0.state);
        if st.closed {
            drop(st);
            return borrower(None);
        }
        st.asked += 1;
        let asked = st.asked;
        let cap = self.0.cap;
        let (peer, at_once) = match st.shares.get_key_value(peer) {
            Some((p, s)) => (p.clone(), s.held < cap && s.waiters.is_empty()),
            None => (Arc::<str>::from(peer), true),
        };
        let buffer = match st.free.pop() {
            Some(b) if at_once => Some(b),
            Some(b) => {
                st.free.push(b);
                None
            }
            None if at_once && st.made < self.0.most => {
                st.made += 1;
                let share = st.shares.entry(peer.clone()).or_default();
                share.held += 1;
                drop(st);
                return borrower(Some(Lent {
                    buffer: Some(HostBuffer::new(self.0.chunk, gpu)),
                    peer,
                    pool: self.0.clone(),
                }));
            }
            None => None,
        };
        let share = st.shares.entry(peer.clone()).or_default();
        let Some(buffer) = buffer else {
            share.waiters.push_back((asked, borrower));
            if st.handoff.is_none() {
                st.handoff = Some(Self::serve());
            }
            return;
        };
        share.held += 1;
        drop(st);
        borrower(Some(Lent {
            buffer: Some(buffer),
            peer,
            pool: self.0.clone(),
        }))
    }

    /// Starts the thread that hands returned buffers to waiters.
    fn serve() -> crossbeam_channel::Sender<(Borrower, Lent)> {
        let (tx, rx) = crossbeam_channel::unbounded::<(Borrower, Lent)>();
        let spawned = std::thread::Builder::new()
            .name("te-staging".into())
            .spawn(move || {
                for (borrower, lent) in rx {
                    borrower(Some(lent));
                }
            });
        if let Err(e) = spawned {
            tracing::error!("cannot start the staging thread: {e}");
        }
        tx
    }

    /// Fails every waiter and lends nothing more; buffers lent out are
    /// freed as they come back.
    pub fn close(&self) {
        let (waiters, handoff) = {
            let mut st = sync::lock(&self.0.state);
            st.closed = true;
            st.free.clear();
            let waiters: Vec<Borrower> = st
                .shares
                .values_mut()
                .flat_map(|s| std::mem::take(&mut s.waiters))
                .map(|(_, w)| w)
                .collect();
            st.shares.retain(|_, s| s.held > 0);
            (waiters, st.handoff.take())
        };
        drop(handoff);
        for w in waiters {
            w(None);
        }
    }
}

impl Drop for StagingPool {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    type Got = (i32, Lent);

    /// Asks `pool` for a buffer for `peer`; a buffer lent goes to `tx`,
    /// tagged `i` (those still waiting when a test ends get none).
    fn ask(pool: &StagingPool, peer: &str, i: i32, tx: &mpsc::Sender<Got>) {
        let tx = tx.clone();
        pool.lend(
            peer,
            0,
            Box::new(move |lent| {
                if let Some(lent) = lent {
                    let _ = tx.send((i, lent));
                }
            }),
        );
    }

    #[test]
    fn a_pool_lends_at_most_its_buffers_first_asked_first_served() {
        let pool = StagingPool::new(64, 4);
        assert_eq!(pool.0.cap, 2);
        let (tx, rx) = mpsc::channel();
        for i in 0..5 {
            ask(&pool, "a", i, &tx);
        }
        // Two (the peer's half) are lent at once; the other three wait.
        let first = rx.recv().expect("first");
        let second = rx.recv().expect("second");
        assert_eq!((first.0, second.0), (0, 1));
        assert!(rx.try_recv().is_err(), "a third buffer was lent");
        drop(first);
        let third = rx.recv().expect("third");
        assert_eq!(third.0, 2);
        drop(second);
        drop(third);
        let order: Vec<i32> = (0..2).map(|_| rx.recv().expect("next").0).collect();
        assert_eq!(order, [3, 4]);
        assert_eq!(sync::lock(&pool.0.state).made, 2);
    }

    #[test]
    fn a_peer_that_holds_its_half_leaves_the_rest_to_the_others() {
        let pool = StagingPool::new(64, 4);
        let (tx, rx) = mpsc::channel();
        // The stuck peer asks for far more than the pool: it gets its
        // half and keeps it.
        for i in 0..10 {
            ask(&pool, "stuck", i, &tx);
        }
        let stuck: Vec<Got> = (0..2).map(|_| rx.recv().expect("lent")).collect();
        assert!(rx.try_recv().is_err());
        // Another peer is lent the other half at once, and gets each
        // buffer it returns back first, ahead of the stuck peer's waiters
        // (which hold more).
        ask(&pool, "ok", 100, &tx);
        ask(&pool, "ok", 101, &tx);
        let ok: Vec<Got> = (0..2).map(|_| rx.recv().expect("lent")).collect();
        assert_eq!(ok.iter().map(|g| g.0).collect::<Vec<_>>(), [100, 101]);
        ask(&pool, "ok", 102, &tx);
        assert!(rx.try_recv().is_err(), "the other peer is at its half too");
        drop(ok);
        // Two came back: one to the other peer's waiter, one free buffer
        // stays free (the stuck peer is at its half).
        let again = rx.recv().expect("lent");
        assert_eq!(again.0, 102);
        assert!(rx.try_recv().is_err());
        assert_eq!(sync::lock(&pool.0.state).free.len(), 1);
        // The stuck peer's buffers come back: its waiters go on in order,
        // still two at a time.
        drop(stuck);
        let next: Vec<Got> = (0..2).map(|_| rx.recv().expect("lent")).collect();
        assert_eq!(next.iter().map(|g| g.0).collect::<Vec<_>>(), [2, 3]);
        assert!(rx.try_recv().is_err());
        drop(again);
    }

    #[test]
    fn a_returned_buffer_goes_to_the_waiting_peer_that_holds_the_fewest() {
        let pool = StagingPool::new(64, 4);
        let (tx, rx) = mpsc::channel();
        ask(&pool, "a", 0, &tx);
        ask(&pool, "a", 1, &tx);
        ask(&pool, "b", 2, &tx);
        ask(&pool, "c", 3, &tx);
        let mut held: Vec<Got> = (0..4).map(|_| rx.recv().expect("lent")).collect();
        ask(&pool, "a", 4, &tx);
        ask(&pool, "b", 5, &tx);
        ask(&pool, "c", 6, &tx);
        // One of a's comes back: a (one held) and b and c (one each) all
        // wait; a asked first.
        let a0 = held.remove(0);
        assert_eq!(a0.0, 0);
        drop(a0);
        let a4 = rx.recv().expect("lent");
        assert_eq!(a4.0, 4);
        // b's comes back: b now holds none, the fewest.
        let b = held.remove(1);
        assert_eq!(b.0, 2);
        drop(b);
        assert_eq!(rx.recv().expect("lent").0, 5);
        drop(a4);
    }

    #[test]
    fn closing_fails_the_waiters_and_frees_what_comes_back() {
        let pool = StagingPool::new(64, 1);
        let (tx, rx) = mpsc::channel();
        let held = {
            let tx = tx.clone();
            pool.lend("a", 0, Box::new(move |l| tx.send(l).expect("send")));
            rx.recv().expect("lent").expect("a buffer")
        };
        pool.lend("b", 0, Box::new(move |l| tx.send(l).expect("send")));
        pool.close();
        assert!(rx.recv().expect("the waiter is answered").is_none());
        drop(held);
        let st = sync::lock(&pool.0.state);
        assert!(st.free.is_empty());
        assert!(st.shares.is_empty(), "{} peers left", st.shares.len());
        drop(st);
        let (tx, rx) = mpsc::channel();
        pool.lend(
            "a",
            0,
            Box::new(move |l| tx.send(l.is_none()).expect("send")),
        );
        assert!(rx.recv().expect("answered"), "a closed pool lends nothing");
    }
}
