//! The threads every piece of Rhai work runs on: workflow scripts, expression
//! compilation and evaluation, and the drop of whatever values they built.
//!
//! Rhai walks nested values and expressions by native recursion (evaluation,
//! clone, compare, print and drop), so how deep it may go is a matter of stack
//! size. A caller's thread has no known stack: an async runtime's workers
//! have 2 MiB, a test harness's threads have 2 MiB, `main` has what `ulimit
//! -s` says. Here every job runs on a thread with [`STACK_BYTES`] of stack,
//! which the sandbox's limits provably fit (see [`STACK_BYTES`]), so no input
//! can overflow it and abort the process.
//!
//! The pool has a fixed number of threads ([`threads`]). Sync callers block
//! on [`run`] (the executor's conditions and templates, reflex conditions,
//! `skein validate`); their jobs go first, and are few (one per waiting
//! thread). Async callers hand a job to [`try_submit`] and await their own
//! channel, so no runtime worker waits; those jobs wait in a bounded queue
//! ([`QUEUE`]) and run on all threads but one, so a burst of submitted
//! workflows never keeps a condition waiting for longer than one job.
//! A job started on a pool thread that asks for the pool again runs inline:
//! nested Rhai work (a script's checks compile its expressions) never waits
//! for a free thread.
//!
//! This module and the deadline of [`crate::expr`] are the only places where
//! this crate starts threads or reads a clock; both only bound Rhai.

use std::cell::Cell;
use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};

/// Stack of each pool thread, in bytes: 256 MiB of address space, of which
/// only what a job touches is ever backed by memory.
///
/// How it was sized: with `no_closure` and `curry` disabled a Rhai value
/// holds other values only in arrays and maps, and the sandbox counts every
/// nested item against `max_array_size` and `max_map_size`, so values nest
/// at most `max_array_size + max_map_size` deep (20,000 for both
/// [`crate::expr::EXPR_LIMITS`] and [`crate::expr::SCRIPT_LIMITS`]). The
/// costliest walk of such a value is Rhai's array `==`, four native frames
/// (about 1.6 KiB) a level: 20,000 levels take about 32 MiB. Expressions nest
/// at most `max_expr_depth` deep and calls `max_call_levels` deep. The tests
/// in `dsl/tests/stack.rs` build each of these at its limit and clone,
/// compare, print, size-check and drop it on a thread with a quarter of this
/// stack ([`STACK_BYTES`] / 4): the limits fit four times over.
pub const STACK_BYTES: usize = 256 << 20;

/// Submitted jobs waiting for a thread, at most; [`try_submit`] refuses more.
pub const QUEUE: usize = 256;

/// Why a job did not run to its end.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// The queue is full: too much Rhai work is waiting already.
    #[error("the server is busy evaluating other workflows ({QUEUE} waiting); try again shortly")]
    Busy,
    /// The pool's threads could not be started.
    #[error("the Rhai evaluation threads could not be started: {0}")]
    Unavailable(String),
    /// The job stopped without an answer (a bug: it panicked).
    #[error("the evaluation stopped unexpectedly")]
    Lost,
}

type Job = Box<dyn FnOnce() + Send>;

/// The two queues: jobs a thread waits on ([`run`]: conditions, templates,
/// validation) go first; submitted jobs ([`try_submit`]: workflows sent to
/// the API) run on all threads but one, so waiting callers always find one.
#[derive(Default)]
struct Queues {
    waited: VecDeque<Job>,
    submitted: VecDeque<Job>,
    /// Submitted jobs running now.
    submitted_running: usize,
}

struct Pool {
    queues: Mutex<Queues>,
    ready: Condvar,
    /// Submitted jobs that may run at once.
    submitted_threads: usize,
}

thread_local! {
    static ON_POOL: Cell<bool> = const { Cell::new(false) };
}

/// Number of pool threads: one per CPU, at least 2 and at most 8.
pub fn threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, 8)
}

/// Whether the calling thread is one of the pool's.
pub fn on_pool() -> bool {
    ON_POOL.with(Cell::get)
}

fn pool() -> Result<&'static Pool, PoolError> {
    static POOL: OnceLock<Result<Arc<Pool>, String>> = OnceLock::new();
    POOL.get_or_init(start)
        .as_ref()
        .map(|p| &**p)
        .map_err(|e| PoolError::Unavailable(e.clone()))
}

fn start() -> Result<Arc<Pool>, String> {
    let threads = threads();
    let pool = Arc::new(Pool {
        queues: Mutex::default(),
        ready: Condvar::new(),
        submitted_threads: threads - 1,
    });
    for i in 0..threads {
        let pool = Arc::clone(&pool);
        std::thread::Builder::new()
            .name(format!("skein-rhai-{i}"))
            .stack_size(STACK_BYTES)
            .spawn(move || work(&pool))
            .map_err(|e| e.to_string())?;
    }
    Ok(pool)
}

fn work(pool: &Pool) {
    ON_POOL.with(|p| p.set(true));
    loop {
        let (job, submitted) = {
            let mut q = pool.queues.lock().unwrap_or_else(PoisonError::into_inner);
            loop {
                if let Some(job) = q.waited.pop_front() {
                    break (job, false);
                }
                if q.submitted_running < pool.submitted_threads
                    && let Some(job) = q.submitted.pop_front()
                {
                    q.submitted_running += 1;
                    break (job, true);
                }
                q = pool.ready.wait(q).unwrap_or_else(PoisonError::into_inner);
            }
        };
        // A panicking job drops its answer channel, which its caller sees as
        // `PoolError::Lost`; the thread goes on with the next job.
        let _ = std::panic::catch_unwind(AssertUnwindSafe(job));
        if submitted {
            pool.queues
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .submitted_running -= 1;
            // A submitted job may wait for the slot this one freed.
            pool.ready.notify_all();
        }
    }
}

/// Queue `job` on the pool without waiting: [`PoolError::Busy`] when
/// [`QUEUE`] submitted jobs wait already. The job sends its own answer
/// (async callers give it the sending half of their channel). Submitted jobs
/// run on all the pool's threads but one.
pub fn try_submit(job: impl FnOnce() + Send + 'static) -> Result<(), PoolError> {
    let pool = pool()?;
    let mut q = pool.queues.lock().unwrap_or_else(PoisonError::into_inner);
    if q.submitted.len() >= QUEUE {
        return Err(PoolError::Busy);
    }
    q.submitted.push_back(Box::new(job));
    drop(q);
    pool.ready.notify_all();
    Ok(())
}

/// Run `f` on a pool thread and wait for its value; inline when the caller
/// is a pool thread already. It goes before every submitted job.
pub fn run<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, PoolError> {
    if on_pool() {
        return Ok(f());
    }
    let pool = pool()?;
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    pool.queues
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .waited
        .push_back(Box::new(move || {
            let _ = tx.send(f());
        }));
    pool.ready.notify_all();
    rx.recv().map_err(|_| PoolError::Lost)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_run_on_pool_threads_and_nested_jobs_inline() {
        assert!(!on_pool());
        let (outer, inner) = run(|| (on_pool(), run(on_pool))).expect("runs");
        assert!(outer);
        assert_eq!(inner, Ok(true));
    }

    #[test]
    fn waited_jobs_pass_submitted_ones() {
        // Fill the submitted side with jobs that wait for a signal.
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let wait = Arc::new(Mutex::new(wait));
        for _ in 0..threads() - 1 {
            let wait = Arc::clone(&wait);
            try_submit(move || {
                let _ = wait.lock().map(|w| w.recv());
            })
            .expect("queued");
        }
        // Every submitted slot is taken; a waited job still runs.
        assert_eq!(run(|| 5), Ok(5));
        for _ in 0..threads() - 1 {
            let _ = go.send(());
        }
    }

    #[test]
    fn a_panicking_job_is_lost_and_the_pool_goes_on() {
        #[allow(clippy::panic)]
        let lost = run(|| -> u8 { panic!("boom") });
        assert_eq!(lost, Err(PoolError::Lost));
        for _ in 0..threads() * 2 {
            assert_eq!(run(|| 7), Ok(7));
        }
    }
}
