//! Batches of tasks. A task is one request; it completes through atomic
//! slice counters that transports bump, and its status is derived from them
//! exactly as Mooncake does (spec §1.3), with `MC_SLICE_TIMEOUT` applied
//! when it is polled.

use crate::clock::{EPOCH, now_nanos};
use crate::codes::{
    STATUS_CANCELED, STATUS_COMPLETED, STATUS_FAILED, STATUS_INVALID, STATUS_PENDING,
    STATUS_TIMEOUT, STATUS_WAITING,
};
use crate::error::{Error, Result};
use crate::sync;
#[cfg(test)]
use crate::task_stats::bucket_of;
use crate::task_stats::{DeferredEnds, End, TaskStats};
use parking_lot_core::{DEFAULT_PARK_TOKEN, DEFAULT_UNPARK_TOKEN};
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence,
};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Cancels so far, in every engine of the process: a transport that holds
/// queued slices looks for cancelled ones when this changed
/// ([`cancels`]).
static CANCELS: AtomicU64 = AtomicU64::new(0);

/// How many cancels there have been in the process: a transport that saw
/// the same number last time it looked has no cancelled slice to find.
pub fn cancels() -> u64 {
    CANCELS.load(Ordering::Acquire)
}

/// Largest `batch_size` accepted by `allocateBatchID`.
pub const MAX_BATCH_SIZE: usize = 1 << 22;

/// Distinct failure reasons a batch keeps; the tasks that fail for
/// another one beyond have none.
const MAX_REASONS: usize = 64;

/// Mooncake's transfer status values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum TaskStatus {
    /// Not all slices have finished.
    Waiting = STATUS_WAITING,
    /// Unused by this engine; kept for the C values.
    Pending = STATUS_PENDING,
    /// Unused by this engine; kept for the C values.
    Invalid = STATUS_INVALID,
    /// Cancelled (`Engine::cancel_batch`): every slice ended, and at least one
    /// was withdrawn or failed after the cancel reached it.
    Canceled = STATUS_CANCELED,
    /// Every slice succeeded.
    Completed = STATUS_COMPLETED,
    /// Still waiting `MC_SLICE_TIMEOUT` after its slices were posted (not
    /// cancelled: a later poll may see it finish).
    Timeout = STATUS_TIMEOUT,
    /// Every slice finished and at least one failed.
    Failed = STATUS_FAILED,
}

/// One request's progress.
#[derive(Debug, Default)]
pub struct Task {
    slice_count: AtomicU64,
    /// Slices finished: those that succeeded in the low 32 bits, those
    /// that failed in the high 32 (one counter, so that exactly one
    /// thread finishes the last slice: [`Task::finish_slice`]).
    done: AtomicU64,
    transferred: AtomicU64,
    observed_terminal: AtomicBool,
    /// Its completion was counted ([`Batch::first_completion`]).
    counted: AtomicBool,
    /// When its slices were posted ([`now_nanos`]).
    submitted: AtomicU64,
    /// Why it failed: 1 + its index in [`Batch::reasons`], 0 for none.
    why: AtomicU32,
    /// A caller parked until it ends ([`Batch::park_on_waiting`]): its
    /// end then wakes the callers parked on it.
    parked: AtomicBool,
    /// Its route and op for the statistics ([`Task::count_submitted`]).
    tag: AtomicU8,
    /// The bytes it asks to move ([`Task::count_submitted`]).
    len: AtomicU64,
    /// Its peer's slot in the per-peer statistics + 1, 0 for none
    /// ([`Task::count_submitted`]).
    peer: AtomicU32,
    /// Where its end is counted: its batch's ([`Batch::counting`]).
    stats: StatsRef,
    /// [`Batch::cancel`] reached it before it ended: transports withdraw
    /// its slices, and those that end unsuccessfully count as cancelled.
    canceled: AtomicBool,
    /// Slices that ended unsuccessfully after the cancel.
    withdrawn: AtomicU32,
    /// The segment its request goes to (the engine's own: 0).
    target: AtomicI32,
    /// Logged as stalled ([`Batch::stalled`]).
    reported: AtomicBool,
}

/// The statistics a counting batch's tasks count their ends in: its
/// [`Batch::stats`], which the batch keeps alive as long as its tasks.
#[derive(Debug, Default, Clone, Copy)]
struct StatsRef(Option<std::ptr::NonNull<TaskStats>>);

// SAFETY: it points to a `TaskStats`, which is `Send + Sync`, kept alive by
// the batch that holds the tasks holding the pointer.
unsafe impl Send for StatsRef {}
// SAFETY: as for `Send`; it is only read.
unsafe impl Sync for StatsRef {}

impl StatsRef {
    fn get(&self) -> Option<&TaskStats> {
        // SAFETY: set by `Batch::counting` to the batch's `stats`, an
        // `Arc` the batch holds until its tasks are dropped with it.
        self.0.map(|p| unsafe { p.as_ref() })
    }
}

/// The bits of [`Task::tag`] that hold its route.
const ROUTE_BITS: u8 = 0b111;
/// [`Task::tag`]'s bit of a WRITE.
const WRITE_BIT: u8 = 1 << 3;

/// One failed slice in [`Task::done`].
const FAILED_ONE: u64 = 1 << 32;

/// The slices that succeeded and failed in a value of [`Task::done`].
fn split_done(done: u64) -> (u64, u64) {
    (done & (FAILED_ONE - 1), done >> 32)
}

impl Task {
    /// Records one finished slice of `len` bytes. The call that finishes
    /// the task's last slice (exactly one: each gets a distinct count of
    /// finished slices, and slices are added only while one is still
    /// unfinished) counts its end in the statistics and wakes the callers
    /// parked on it.
    pub fn finish_slice(&self, len: u64, ok: bool) {
        self.finish_slice_within(len, ok, None);
    }

    /// [`Task::finish_slice`] within the submit call of the task, whose
    /// end is then counted in `ends` when it is the deferral of that call.
    pub fn finish_slice_within(&self, len: u64, ok: bool, ends: Option<&DeferredEnds<'_>>) {
        // The count and the flag's load are `SeqCst` to pair with the
        // fence in `Batch::park_on_waiting`: either a caller about to park
        // sees this slice finished, or this sees it parked. (On x86 the
        // locked add is a full barrier anyway, so this costs no fence.)
        if ok {
            self.transferred.fetch_add(len, Ordering::Relaxed);
        } else if self.canceled.load(Ordering::Acquire) {
            // Counted before the slice is (both `SeqCst`): whoever sees
            // the slice ended sees why.
            self.withdrawn.fetch_add(1, Ordering::SeqCst);
        }
        let one = if ok { 1 } else { FAILED_ONE };
        let done = self.done.fetch_add(one, Ordering::SeqCst).wrapping_add(one);
        let (succeeded, failed) = split_done(done);
        if succeeded + failed != self.slice_count.load(Ordering::SeqCst) {
            return;
        }
        if let Some(stats) = self.stats.get() {
            let result = if self.withdrawn.load(Ordering::Acquire) > 0 {
                2
            } else {
                usize::from(failed > 0)
            };
            self.count_end(stats, result, ends);
        }
        if self.parked.load(Ordering::SeqCst) {
            // SAFETY: the key is this task's address, which only
            // `Batch::park_on_waiting` parks on.
            unsafe { parking_lot_core::unpark_all(self.park_key(), DEFAULT_UNPARK_TOKEN) };
        }
    }

    /// Notes what the statistics count at the task's end: a WRITE or
    /// READ of `len` bytes, going to `route` (see [`crate::task_stats`]),
    /// to the peer in slot `peer` (`TaskStats::peer_slot`; 0: none).
    /// Called once, before its first slice is counted (its submission is
    /// counted with its submit call's, [`TaskStats::submitted`]).
    pub fn count_submitted(&self, write: bool, route: usize, len: u64, peer: u32) {
        let tag = (route as u8 & ROUTE_BITS) | if write { WRITE_BIT } else { 0 };
        self.tag.store(tag, Ordering::Relaxed);
        self.len.store(len, Ordering::Relaxed);
        self.peer.store(peer, Ordering::Relaxed);
    }

    /// The task goes on over `route` (the transport it was handed to, or a
    /// fallback that took a part of it over): its end is counted there.
    pub fn set_route(&self, route: usize) {
        let route = route as u8 & ROUTE_BITS;
        if self.tag.load(Ordering::Relaxed) & ROUTE_BITS == route {
            return;
        }
        let _ = self
            .tag
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                Some(t & !ROUTE_BITS | route)
            });
    }

    /// Counts the task's end (`result`: 0 COMPLETED, 1 FAILED, 2 CANCELED)
    /// in `stats`; called once, by the call that finished its last slice.
    fn count_end(&self, stats: &TaskStats, result: usize, ends: Option<&DeferredEnds<'_>>) {
        let tag = self.tag.load(Ordering::Acquire);
        let end = End {
            route: usize::from(tag & ROUTE_BITS),
            op: usize::from(tag & WRITE_BIT != 0),
            result,
            requested: self.len.load(Ordering::Relaxed),
            moved: self.transferred.load(Ordering::Relaxed),
            submitted: self.submitted.load(Ordering::Relaxed),
            peer: self.peer.load(Ordering::Relaxed),
        };
        match ends {
            Some(ends) if ends.holds(stats, end.submitted) => ends.end(end),
            _ => stats.ended(end),
        }
    }

    /// When the task was submitted ([`now_nanos`]), for
    /// [`TaskStats::defer_ends`].
    pub fn submitted_at(&self) -> u64 {
        self.submitted.load(Ordering::Relaxed)
    }

    /// The key callers park on until this task ends.
    fn park_key(&self) -> usize {
        self as *const Task as usize
    }

    /// Adds slices to a task before they are dispatched (a transport that
    /// splits a slice further announces the extra parts here first).
    pub fn add_slices(&self, n: u64) {
        // `SeqCst` pairs with `Task::cancel`: a task whose slices are not
        // counted yet is either seen by the cancel with slices, or sees
        // the cancel ([`Task::begin`]).
        self.slice_count.fetch_add(n, Ordering::SeqCst);
    }

    /// Whether [`Batch::cancel`] reached this task before it ended: its
    /// slices not yet moving are not to be moved, nor retried elsewhere.
    pub fn is_canceled(&self) -> bool {
        self.canceled.load(Ordering::Acquire)
    }

    /// Opens a task whose request goes to its transports later (after a
    /// fetch of the peer's descriptor): counts one slice that holds it
    /// open, and returns `false` (ending that slice) when the task was
    /// cancelled meanwhile and must not be submitted. Otherwise the caller
    /// submits it, then ends the slice with `finish_slice(0, true)`.
    pub fn begin(&self) -> bool {
        self.add_slices(1);
        if self.canceled.load(Ordering::SeqCst) {
            self.finish_slice(0, false);
            return false;
        }
        true
    }

    /// Marks the task cancelled unless it has ended; whether it was still
    /// running. A task with no slice counted yet (waiting for its peer's
    /// descriptor) ends at once; [`Task::begin`] keeps it from starting.
    fn cancel(&self) -> bool {
        if self.status().0 != TaskStatus::Waiting {
            return false;
        }
        self.canceled.store(true, Ordering::SeqCst);
        if self.slice_count.load(Ordering::SeqCst) == 0 {
            self.add_slices(1);
            self.finish_slice(0, false);
        }
        true
    }

    /// The status and transferred bytes, as `getTransferStatus` reports them.
    pub fn status(&self) -> (TaskStatus, u64) {
        let n = self.slice_count.load(Ordering::Acquire);
        let (ok, failed) = split_done(self.done.load(Ordering::Acquire));
        let bytes = self.transferred.load(Ordering::Relaxed);
        let status = if n > 0 && ok + failed >= n {
            if self.withdrawn.load(Ordering::Acquire) > 0 {
                TaskStatus::Canceled
            } else if failed > 0 {
                TaskStatus::Failed
            } else {
                TaskStatus::Completed
            }
        } else {
            TaskStatus::Waiting
        };
        (status, bytes)
    }

    /// Clears a slot before it is filled again.
    fn reset(&self, now: u64) {
        self.slice_count.store(0, Ordering::Relaxed);
        self.done.store(0, Ordering::Relaxed);
        self.transferred.store(0, Ordering::Relaxed);
        self.observed_terminal.store(false, Ordering::Relaxed);
        self.counted.store(false, Ordering::Relaxed);
        self.submitted.store(now, Ordering::Relaxed);
        self.why.store(0, Ordering::Relaxed);
        self.parked.store(false, Ordering::Relaxed);
        self.tag.store(0, Ordering::Relaxed);
        self.len.store(0, Ordering::Relaxed);
        self.peer.store(0, Ordering::Relaxed);
        self.canceled.store(false, Ordering::Relaxed);
        self.withdrawn.store(0, Ordering::Relaxed);
        self.target.store(0, Ordering::Relaxed);
        self.reported.store(false, Ordering::Relaxed);
    }

    /// Records the segment its request goes to, for the stall report.
    pub fn set_target(&self, segment: i32) {
        self.target.store(segment, Ordering::Relaxed);
    }

    /// Marks that a caller has seen this task terminal (needed by
    /// `freeBatchID`).
    fn observe(&self, status: TaskStatus) {
        if matches!(
            status,
            TaskStatus::Completed | TaskStatus::Failed | TaskStatus::Canceled
        ) {
            self.observed_terminal.store(true, Ordering::Release);
        }
    }
}

/// A task waiting longer than the stall report's bound
/// ([`Batch::stalled`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stalled {
    /// Its id in the batch.
    pub task: usize,
    /// The segment its request goes to.
    pub target: i32,
    /// Its slices so far, and how many of them ended.
    pub slices: u64,
    /// How many of its slices ended.
    pub ended: u64,
    /// How long it has waited since its submission.
    pub waited: Duration,
}

/// A task as a slice of it refers to it: lets a transport holding the
/// slice ask whether the task was cancelled.
#[derive(Debug, Clone)]
pub struct TaskRef {
    batch: Arc<Batch>,
    task: usize,
}

impl TaskRef {
    /// Task `task` of `batch`.
    pub fn new(batch: Arc<Batch>, task: usize) -> TaskRef {
        TaskRef { batch, task }
    }

    /// Whether the task was cancelled ([`Task::is_canceled`]).
    pub fn canceled(&self) -> bool {
        self.batch.slot(self.task).is_some_and(Task::is_canceled)
    }
}

/// A notification to send once every task of its batch has completed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingNotify {
    /// Segment whose owner receives it.
    pub target_id: i32,
    /// Name field of the notification.
    pub name: String,
    /// Message field of the notification.
    pub msg: String,
}

/// Where a batch's notification stands (`te_notify_status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotifyStatus {
    /// The batch carries none.
    None,
    /// Its tasks are still running, or it is being sent (or sent again
    /// while the peer cannot take it).
    Pending,
    /// The peer's engine accepted it.
    Delivered,
    /// It was not delivered, and will not be: why.
    Failed(Arc<str>),
}

/// A batch's notification through its life.
#[derive(Debug)]
enum Notify {
    None,
    /// Sent once every task has completed.
    Waiting(PendingNotify),
    Sending,
    Delivered,
    Failed(Arc<str>),
}

/// A batch: a fixed number of task slots filled by successive submits.
#[derive(Debug)]
pub struct Batch {
    tasks: Box<[Task]>,
    /// `MC_SLICE_TIMEOUT`, if on.
    slice_timeout: Option<Duration>,
    len: AtomicUsize,
    submit_lock: Mutex<()>,
    notify: Mutex<Notify>,
    /// The distinct reasons its tasks failed for, at most [`MAX_REASONS`].
    reasons: Mutex<Vec<Arc<str>>>,
    /// Where its tasks are counted ([`Batch::counting`]).
    stats: Option<Arc<TaskStats>>,
}

impl Batch {
    /// How many tasks have been submitted so far.
    pub fn submitted(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    /// A batch with room for `capacity` tasks whose waiting tasks report
    /// TIMEOUT once `slice_timeout` has passed since they were submitted.
    pub fn new(capacity: usize, slice_timeout: Option<Duration>) -> Result<Batch> {
        if capacity > MAX_BATCH_SIZE {
            return Err(Error::InvalidArgument(format!(
                "batch_size {capacity} exceeds the maximum of {MAX_BATCH_SIZE}"
            )));
        }
        let tasks = (0..capacity).map(|_| Task::default()).collect();
        Ok(Batch {
            tasks,
            slice_timeout,
            len: AtomicUsize::new(0),
            submit_lock: Mutex::new(()),
            notify: Mutex::new(Notify::None),
            reasons: Mutex::new(Vec::new()),
            stats: None,
        })
    }

    /// The batch with its tasks counted in `stats`.
    pub fn counting(mut self, stats: Arc<TaskStats>) -> Batch {
        let at = StatsRef(Some(std::ptr::NonNull::from(&*stats)));
        for t in self.tasks.iter_mut() {
            t.stats = at;
        }
        self.stats = Some(stats);
        self
    }

    /// Where its tasks are counted, if they are.
    pub fn stats(&self) -> Option<&TaskStats> {
        self.stats.as_deref()
    }

    /// Reserves `count` task slots and runs `fill` on them (with their first
    /// task id) while submits to this batch are serialized. The slots become
    /// visible to status queries only after `fill` returns.
    pub fn append<R>(
        &self,
        count: usize,
        fill: impl FnOnce(usize, &[Task]) -> Result<R>,
    ) -> Result<R> {
        let _guard = sync::lock(&self.submit_lock);
        let start = self.len.load(Ordering::Acquire);
        self.room_after(start, count)?;
        let slots = &self.tasks[start..start + count];
        let now = now_nanos();
        slots.iter().for_each(|t| t.reset(now));
        let out = fill(start, slots)?;
        self.len.store(start + count, Ordering::Release);
        Ok(out)
    }

    /// Refuses `count` more tasks when they do not fit in the room the
    /// batch has now, with the error of [`Batch::append`]: lets the C
    /// boundary refuse a count before it reads that many requests (the
    /// submit itself checks again).
    pub fn room_for(&self, count: usize) -> Result<()> {
        self.room_after(self.len.load(Ordering::Acquire), count)
    }

    /// Whether `count` more tasks fit after the first `start`.
    fn room_after(&self, start: usize, count: usize) -> Result<()> {
        if start.saturating_add(count) > self.tasks.len() {
            return Err(Error::TooManyRequests(format!(
                "batch holds {start} of {} tasks; {count} more do not fit",
                self.tasks.len()
            )));
        }
        Ok(())
    }

    /// The task slot with this id, published or not (for transports that
    /// finish slices of a submit still in progress).
    pub fn slot(&self, id: usize) -> Option<&Task> {
        self.tasks.get(id)
    }

    /// The task with this id, if it was submitted.
    pub fn task(&self, id: usize) -> Option<&Task> {
        (id < self.len.load(Ordering::Acquire)).then(|| &self.tasks[id])
    }

    /// Status of task `id`, recording that the caller saw it terminal. A
    /// task still waiting when the slice timeout has passed since its
    /// slices were posted reports TIMEOUT (as Mooncake's
    /// `MultiTransport::getTransferStatus`): it is neither cancelled nor
    /// terminal, and a later poll may see it complete or fail.
    pub fn poll(&self, id: usize) -> Result<(TaskStatus, u64)> {
        let task = self.task(id).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "task id {id} is out of range (batch has {} tasks)",
                self.len.load(Ordering::Acquire)
            ))
        })?;
        let (mut status, bytes) = task.status();
        task.observe(status);
        if let Some(limit) = self.slice_timeout {
            let posted = task.submitted.load(Ordering::Relaxed);
            let waited = Duration::from_nanos(now_nanos().saturating_sub(posted));
            if status == TaskStatus::Waiting && waited > limit {
                status = TaskStatus::Timeout;
            }
        }
        Ok((status, bytes))
    }

    /// Records why task `id` fails, before its failing slice is finished;
    /// the first reason given is kept. Reasons are kept once per batch
    /// (at most [`MAX_REASONS`] distinct ones), so a task costs no memory
    /// for one.
    pub fn note_failure(&self, id: usize, why: &str) {
        let Some(task) = self.slot(id) else {
            return;
        };
        if task.why.load(Ordering::Acquire) != 0 {
            return;
        }
        let mut reasons = sync::lock(&self.reasons);
        let at = match reasons.iter().position(|r| &**r == why) {
            Some(at) => at,
            None if reasons.len() < MAX_REASONS => {
                reasons.push(why.into());
                reasons.len() - 1
            }
            None => return,
        };
        let _ = task
            .why
            .compare_exchange(0, at as u32 + 1, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Why task `id` failed, if it did and a reason was recorded.
    pub fn failure(&self, id: usize) -> Option<Arc<str>> {
        let task = self.task(id)?;
        if task.status().0 != TaskStatus::Failed {
            return None;
        }
        let at = (task.why.load(Ordering::Acquire) as usize).checked_sub(1)?;
        sync::lock(&self.reasons).get(at).cloned()
    }

    /// The bytes of task `id` and how long it took from submission, the
    /// first time this is asked after it completed (the engine's metrics
    /// count each task once); `None` otherwise.
    pub fn first_completion(&self, id: usize) -> Option<(u64, Duration)> {
        let task = self.task(id)?;
        let (status, bytes) = task.status();
        if status != TaskStatus::Completed || task.counted.swap(true, Ordering::AcqRel) {
            return None;
        }
        let posted = task.submitted.load(Ordering::Relaxed);
        Some((
            bytes,
            Duration::from_nanos(now_nanos().saturating_sub(posted)),
        ))
    }

    /// Parks the calling thread until a task among the first `tasks` that
    /// is still waiting ends, `until` passes, or the first of them passes
    /// the slice timeout (when it reports TIMEOUT); returns at once when
    /// none is waiting. It parks on the last such task, the one likely to
    /// end last, so a batch whose tasks end in order wakes it about once.
    pub fn park_on_waiting(&self, tasks: usize, until: Instant) {
        let n = tasks.min(self.submitted());
        let waiting = || {
            self.tasks[..n]
                .iter()
                .filter(|t| t.status().0 == TaskStatus::Waiting)
        };
        let Some(task) = waiting().last() else {
            // Every task ended: a notification being sent is waited for.
            let sending = || matches!(*sync::lock(&self.notify), Notify::Sending);
            if sending() {
                // SAFETY: the key is the address of this batch's
                // notification, which only this function parks on; the
                // validation takes the notification's lock, which neither
                // panics here nor calls into `parking_lot_core`, and the
                // settling side unparks after setting the state, so a
                // settlement between the check and the sleep is seen by
                // the check under the queue lock.
                unsafe {
                    parking_lot_core::park(
                        self.notify_key(),
                        sending,
                        || {},
                        |_, _| {},
                        DEFAULT_PARK_TOKEN,
                        Some(until),
                    );
                }
            }
            return;
        };
        // Woken by the parked task's end, or once the first waiting task
        // reports TIMEOUT (the earliest submitted reaches it first).
        let first = waiting()
            .map(|t| t.submitted.load(Ordering::Relaxed))
            .min()
            .unwrap_or(0);
        let until = self
            .slice_timeout
            .and_then(|limit| Duration::from_nanos(first).checked_add(limit))
            .and_then(|after| EPOCH.checked_add(after))
            .map_or(until, |timeout| until.min(timeout));
        task.parked.store(true, Ordering::Relaxed);
        // Pairs with the `SeqCst` count and load in `Task::finish_slice`.
        fence(Ordering::SeqCst);
        // SAFETY: the key is the task's address, which only this function
        // parks on; the callbacks neither panic nor call into
        // `parking_lot_core`. The check runs under the key's queue lock,
        // which `unpark_all` takes too, so an end between the check and
        // the sleep is not missed.
        unsafe {
            parking_lot_core::park(
                task.park_key(),
                || task.status().0 == TaskStatus::Waiting,
                || {},
                |_, _| {},
                DEFAULT_PARK_TOKEN,
                Some(until),
            );
        }
    }

    /// Cancels the submitted tasks that have not ended (a submit under way
    /// to this batch finishes first; tasks it adds later are not
    /// cancelled); returns how many tasks the batch holds, all of which
    /// the cancel covers. Transports withdraw the slices of cancelled
    /// tasks they have not begun to move, and do not retry the others
    /// when they fail: each such task ends once its moving slices end.
    pub fn cancel(&self) -> usize {
        let _guard = sync::lock(&self.submit_lock);
        let n = self.len.load(Ordering::Acquire);
        let mut any = false;
        for t in &self.tasks[..n] {
            any |= t.cancel();
        }
        if any {
            CANCELS.fetch_add(1, Ordering::AcqRel);
        }
        n
    }

    /// Whether every one of the first `tasks` tasks has ended; if so, each
    /// counts as seen by a caller (the batch may be freed).
    pub fn ended(&self, tasks: usize) -> bool {
        let n = tasks.min(self.submitted());
        let all = self.first_ended(n);
        if all {
            for t in &self.tasks[..n] {
                t.observe(t.status().0);
            }
        }
        all
    }

    /// The tasks still waiting `after` their submission that were not
    /// reported yet; each is reported once.
    pub fn stalled(&self, after: Duration) -> Vec<Stalled> {
        let now = now_nanos();
        let limit = u64::try_from(after.as_nanos()).unwrap_or(u64::MAX);
        self.tasks[..self.submitted()]
            .iter()
            .enumerate()
            .filter(|(_, t)| t.status().0 == TaskStatus::Waiting)
            .filter_map(|(id, t)| {
                let waited = now.saturating_sub(t.submitted.load(Ordering::Relaxed));
                (waited >= limit && !t.reported.swap(true, Ordering::AcqRel)).then(|| Stalled {
                    task: id,
                    target: t.target.load(Ordering::Relaxed),
                    slices: t.slice_count.load(Ordering::Acquire),
                    ended: {
                        let (ok, failed) = split_done(t.done.load(Ordering::Acquire));
                        ok + failed
                    },
                    waited: Duration::from_nanos(waited),
                })
            })
            .collect()
    }

    /// Whether every one of the first `n` submitted tasks has ended.
    fn first_ended(&self, n: usize) -> bool {
        self.tasks[..n]
            .iter()
            .all(|t| t.status().0 != TaskStatus::Waiting)
    }

    /// Whether every submitted task has been seen terminal by a caller.
    pub fn all_observed(&self) -> bool {
        let n = self.len.load(Ordering::Acquire);
        self.tasks[..n]
            .iter()
            .all(|t| t.observed_terminal.load(Ordering::Acquire))
    }

    /// Whether every submitted task has completed successfully.
    pub fn all_completed(&self) -> bool {
        let n = self.len.load(Ordering::Acquire);
        self.tasks[..n]
            .iter()
            .all(|t| t.status().0 == TaskStatus::Completed)
    }

    /// Remembers a notification for this batch (replacing an earlier one
    /// not yet sent).
    pub fn set_notify(&self, n: PendingNotify) {
        *sync::lock(&self.notify) = Notify::Waiting(n);
    }

    /// Takes the notification to send once every task has completed (it
    /// is then being sent); once every task has ended and one did not
    /// complete, it fails unsent.
    pub fn take_notify_to_send(&self) -> Option<PendingNotify> {
        let mut slot = sync::lock(&self.notify);
        if !matches!(*slot, Notify::Waiting(_)) {
            return None;
        }
        if self.all_completed() {
            return match std::mem::replace(&mut *slot, Notify::Sending) {
                Notify::Waiting(n) => Some(n),
                _ => None,
            };
        }
        if self.first_ended(self.submitted()) {
            *slot = Notify::Failed(
                "a task of the batch failed or was cancelled: the notification was not sent".into(),
            );
            drop(slot);
            self.wake_notify_waiters();
        }
        None
    }

    /// The notification being sent was accepted by the peer (`Ok`), or
    /// will not be (why).
    pub fn notify_ended(&self, outcome: std::result::Result<(), String>) {
        {
            let mut slot = sync::lock(&self.notify);
            if !matches!(*slot, Notify::Sending) {
                return;
            }
            *slot = match outcome {
                Ok(()) => Notify::Delivered,
                Err(why) => Notify::Failed(why.into()),
            };
        }
        self.wake_notify_waiters();
    }

    /// Where the batch's notification stands.
    pub fn notify_status(&self) -> NotifyStatus {
        match &*sync::lock(&self.notify) {
            Notify::None => NotifyStatus::None,
            Notify::Waiting(_) | Notify::Sending => NotifyStatus::Pending,
            Notify::Delivered => NotifyStatus::Delivered,
            Notify::Failed(why) => NotifyStatus::Failed(why.clone()),
        }
    }

    /// The key callers park on while the notification is being sent.
    fn notify_key(&self) -> usize {
        &self.notify as *const Mutex<Notify> as usize
    }

    /// Wakes the callers parked until the notification is settled.
    fn wake_notify_waiters(&self) {
        // SAFETY: the key is the address of this batch's notification,
        // which only `Batch::park_on_waiting` parks on.
        unsafe { parking_lot_core::unpark_all(self.notify_key(), DEFAULT_UNPARK_TOKEN) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_follows_slice_counters() {
        let b = Batch::new(2, None).unwrap();
        b.append(1, |first, tasks| {
            assert_eq!(first, 0);
            tasks[0].add_slices(2);
            Ok(())
        })
        .unwrap();
        assert_eq!(b.poll(0).unwrap().0, TaskStatus::Waiting);
        let t = b.task(0).unwrap();
        t.finish_slice(10, true);
        assert_eq!(b.poll(0).unwrap(), (TaskStatus::Waiting, 10));
        assert!(!b.all_observed());
        t.finish_slice(5, false);
        assert_eq!(b.poll(0).unwrap(), (TaskStatus::Failed, 10));
        assert!(b.all_observed());
        assert!(!b.all_completed());
        assert!(matches!(b.poll(1), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn a_task_waiting_past_the_slice_timeout_reports_timeout_until_it_finishes() {
        let limit = Duration::from_millis(50);
        let b = Batch::new(2, Some(limit)).unwrap();
        let start = Instant::now();
        b.append(2, |_, tasks| {
            tasks.iter().for_each(|t| t.add_slices(1));
            Ok(())
        })
        .unwrap();
        b.task(1).unwrap().finish_slice(7, true);
        // A poll within the limit sees WAITING (only a poll after it can
        // see TIMEOUT, whatever the machine's speed).
        let first = b.poll(0).unwrap().0;
        if start.elapsed() < limit {
            assert_eq!(first, TaskStatus::Waiting);
        }
        std::thread::sleep(limit * 2);
        assert_eq!(b.poll(0).unwrap(), (TaskStatus::Timeout, 0));
        assert_eq!(
            b.poll(1).unwrap(),
            (TaskStatus::Completed, 7),
            "a finished task is never TIMEOUT"
        );
        assert!(!b.all_observed(), "TIMEOUT is not terminal");
        b.task(0).unwrap().finish_slice(3, true);
        assert_eq!(b.poll(0).unwrap(), (TaskStatus::Completed, 3));
        assert!(b.all_observed());
        // Without a limit a waiting task stays WAITING.
        let off = Batch::new(1, None).unwrap();
        off.append(1, |_, t| {
            t[0].add_slices(1);
            Ok(())
        })
        .unwrap();
        std::thread::sleep(limit * 2);
        assert_eq!(off.poll(0).unwrap().0, TaskStatus::Waiting);
    }

    #[test]
    fn a_failed_task_keeps_its_first_reason_and_batches_keep_few() {
        let b = Batch::new(MAX_REASONS + 3, None).unwrap();
        b.append(MAX_REASONS + 3, |_, tasks| {
            tasks.iter().for_each(|t| t.add_slices(1));
            Ok(())
        })
        .unwrap();
        b.note_failure(0, "refused");
        b.note_failure(0, "later");
        assert_eq!(b.failure(0), None, "not failed yet");
        b.task(0).unwrap().finish_slice(0, false);
        assert_eq!(b.failure(0).as_deref(), Some("refused"));
        b.note_failure(1, "refused");
        b.task(1).unwrap().finish_slice(0, false);
        assert_eq!(b.failure(1).as_deref(), Some("refused"));
        assert_eq!(sync::lock(&b.reasons).len(), 1, "one copy of a reason");
        for i in 2..MAX_REASONS + 3 {
            b.note_failure(i, &format!("reason {i}"));
            b.task(i).unwrap().finish_slice(0, false);
        }
        assert_eq!(b.failure(MAX_REASONS).as_deref(), Some("reason 64"));
        assert_eq!(
            b.failure(MAX_REASONS + 1),
            None,
            "beyond the distinct reasons kept"
        );
        assert_eq!(std::mem::size_of::<Task>(), 72);
    }

    #[test]
    fn a_task_end_is_counted_once_after_its_last_slice() {
        let stats = Arc::new(TaskStats::default());
        let b = Batch::new(2, None).unwrap().counting(stats.clone());
        b.append(2, |_, t| {
            stats.submitted(2, 38);
            t[0].count_submitted(true, 1, 30, 0);
            t[0].add_slices(2);
            t[1].count_submitted(false, 0, 8, 0);
            t[1].add_slices(1);
            Ok(())
        })
        .unwrap();
        let t = b.task(0).unwrap();
        t.finish_slice(10, true);
        // A fallback takes the second slice over: its two parts are
        // counted before the slice it replaces ends.
        t.add_slices(2);
        t.finish_slice(0, true);
        assert_eq!(stats.snapshot().inflight, 2, "not ended early");
        t.finish_slice(15, true);
        t.finish_slice(5, false);
        assert_eq!(b.poll(0).unwrap().0, TaskStatus::Failed);
        b.task(1).unwrap().finish_slice(8, true);
        assert_eq!(b.poll(1).unwrap().0, TaskStatus::Completed);
        let s = stats.snapshot();
        assert_eq!((s.inflight, s.inflight_bytes), (0, 0));
        assert_eq!(s.ended, [[1, 0, 0], [0, 1, 0]], "by op, then result");
        assert_eq!((s.moved[1][1], s.moved[0][0]), (25, 8));
        let ended: u64 = s.buckets.iter().flatten().flatten().sum();
        assert_eq!(ended, 2, "one duration per task");
    }

    #[test]
    fn ends_within_the_submit_are_counted_when_it_returns() {
        let stats = Arc::new(TaskStats::default());
        let b = Batch::new(4, None).unwrap().counting(stats.clone());
        b.append(3, |_, t| {
            stats.submitted(3, 12);
            let ends = stats.defer_ends(t[0].submitted_at());
            assert!(ends.is_some());
            for (i, task) in t.iter().enumerate() {
                task.count_submitted(true, 0, 4, 0);
                task.add_slices(1);
                // Through the deferral, or found by the thread's.
                task.finish_slice_within(4, i != 1, ends.as_ref().filter(|_| i == 0));
            }
            let s = stats.snapshot();
            assert_eq!((s.inflight, s.moved[0][1]), (3, 8), "bytes now, ends later");
            std::thread::sleep(Duration::from_millis(2));
            drop(ends);
            Ok(())
        })
        .unwrap();
        let s = stats.snapshot();
        assert_eq!((s.inflight, s.ended[1]), (0, [2, 1, 0]));
        let at_least_2ms = bucket_of(2_000);
        let slow: u64 = s.buckets[0][1][at_least_2ms..].iter().sum();
        assert_eq!(slow, 3, "each took the whole submit call");
        assert!(s.seconds[0][1] >= 3.0 * 0.002, "{}", s.seconds[0][1]);
        // A task cancelled later ends CANCELED, counted as it ends.
        b.append(1, |_, t| {
            stats.submitted(1, 4);
            t[0].count_submitted(false, 1, 4, 0);
            t[0].add_slices(1);
            Ok(())
        })
        .unwrap();
        assert_eq!(stats.snapshot().inflight, 1);
        assert!(b.task(3).unwrap().cancel());
        b.task(3).unwrap().finish_slice(0, false);
        assert_eq!(b.poll(3).unwrap().0, TaskStatus::Canceled);
        let s = stats.snapshot();
        assert_eq!((s.inflight, s.ended[0]), (0, [0, 0, 1]));
    }

    #[test]
    fn racing_last_slices_and_polls_count_each_end_once() {
        const TASKS: usize = 2000;
        let stats = Arc::new(TaskStats::default());
        let b = Batch::new(TASKS, None).unwrap().counting(stats.clone());
        b.append(TASKS, |_, t| {
            stats.submitted(TASKS as u64, 2 * TASKS as u64);
            for task in t {
                task.count_submitted(true, 2, 2, 0);
                task.add_slices(2);
            }
            Ok(())
        })
        .unwrap();
        std::thread::scope(|s| {
            for ok in [true, false] {
                let b = &b;
                s.spawn(move || (0..TASKS).for_each(|i| b.task(i).unwrap().finish_slice(1, ok)));
            }
            let b = &b;
            s.spawn(move || {
                for _ in 0..3 {
                    (0..TASKS).for_each(|i| drop(b.poll(i)));
                }
            });
        });
        let s = stats.snapshot();
        assert_eq!(s.ended[1], [0, TASKS as u64, 0]);
        assert_eq!((s.inflight, s.inflight_bytes), (0, 0));
        assert_eq!(s.moved[2][1], TASKS as u64);
    }

    #[test]
    fn capacity_is_checked_before_filling() {
        let b = Batch::new(3, None).unwrap();
        b.append(2, |_, t| {
            t.iter().for_each(|t| t.add_slices(1));
            Ok(())
        })
        .unwrap();
        let r = b.append(2, |_, _| -> Result<()> { panic!("must not fill") });
        assert!(matches!(r, Err(Error::TooManyRequests(_))));
        // The same answer before an append, for any count.
        assert!(b.room_for(1).is_ok());
        for n in [2, 1 << 31, 1 << 61, 1 << 62, usize::MAX] {
            assert!(
                matches!(b.room_for(n), Err(Error::TooManyRequests(_))),
                "{n}"
            );
        }
        // a failing fill publishes nothing
        let r = b.append(1, |_, _| -> Result<()> {
            Err(Error::InvalidArgument("x".into()))
        });
        assert!(r.is_err());
        assert_eq!(b.submitted(), 2);
        assert!(Batch::new(MAX_BATCH_SIZE + 1, None).is_err());
    }

    /// A batch of `tasks` tasks of one slice each.
    fn one_slice_tasks(tasks: usize, slice_timeout: Option<Duration>) -> Batch {
        let b = Batch::new(tasks, slice_timeout).unwrap();
        b.append(tasks, |_, t| {
            t.iter().for_each(|t| t.add_slices(1));
            Ok(())
        })
        .unwrap();
        b
    }

    #[test]
    fn a_parked_caller_wakes_when_a_waiting_task_ends() {
        let far = Duration::from_secs(10);
        let b = one_slice_tasks(3, None);
        b.task(0).unwrap().finish_slice(1, true);
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(50));
                b.task(2).unwrap().finish_slice(1, false);
            });
            let start = Instant::now();
            b.park_on_waiting(3, start + far);
            assert!(
                start.elapsed() < far / 2,
                "woken by the end, not the deadline"
            );
        });
        assert_eq!(b.poll(2).unwrap().0, TaskStatus::Failed);
        // Task 1 still waits: parking returns at the deadline.
        let start = Instant::now();
        b.park_on_waiting(3, start + Duration::from_millis(100));
        assert!(start.elapsed() >= Duration::from_millis(100));
        assert_eq!(b.poll(1).unwrap().0, TaskStatus::Waiting);
        // Only tasks within the count are waited for.
        let start = Instant::now();
        b.park_on_waiting(1, start + far);
        assert!(start.elapsed() < far / 2);
    }

    #[test]
    fn no_end_is_missed_when_it_races_the_park() {
        let far = Duration::from_secs(10);
        for round in 0..4000u32 {
            let b = one_slice_tasks(1, None);
            let both = std::sync::Barrier::new(2);
            std::thread::scope(|s| {
                s.spawn(|| {
                    both.wait();
                    // Ends the task at every moment of the park in turn.
                    for _ in 0..round % 400 {
                        std::hint::spin_loop();
                    }
                    b.task(0).unwrap().finish_slice(1, true);
                });
                both.wait();
                let start = Instant::now();
                b.park_on_waiting(1, start + far);
                assert!(
                    start.elapsed() < far / 2,
                    "round {round}: an end was missed"
                );
            });
        }
    }

    #[test]
    fn a_parked_caller_wakes_when_its_task_passes_the_slice_timeout() {
        let limit = Duration::from_millis(100);
        let b = one_slice_tasks(1, Some(limit));
        let far = Duration::from_secs(10);
        let start = Instant::now();
        b.park_on_waiting(1, start + far);
        assert!(start.elapsed() >= limit && start.elapsed() < far / 2);
        assert_eq!(b.poll(0).unwrap().0, TaskStatus::Timeout);
    }
}
