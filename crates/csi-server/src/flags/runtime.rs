//! The process a driver runs as: its tokio runtime, its allocator and
//! glibc's malloc arenas. A node plugin runs on every node of a cluster, so
//! what it keeps resident between calls is multiplied by the node count;
//! each choice here is measured in docs/benchmarks.md ("Peak RSS").

/// The most threads [`driver_runtime`]'s blocking pool starts: every call
/// that waits on the kernel (mounts, copies, durable writes, mkfs) runs
/// there. Each thread keeps its touched stack and thread-local caches; with
/// the async part on one thread, 8 concurrent lifecycles ran as fast with
/// four of them as with tokio's default of 512.
pub const BLOCKING_THREADS: usize = 4;

/// The runtime builder a driver's `main` passes to
/// [`run_to_exit`](super::run_to_exit): the async part (gRPC, the tower
/// stack) on the calling thread, blocking work on at most
/// [`BLOCKING_THREADS`] threads. Serving is far from CPU-bound on the async
/// side, so worker threads would only add stacks and wake-ups. A driver
/// whose calls block for long (a large mkfs, a copy) and must not queue
/// behind four of them raises the limit with `max_blocking_threads`.
pub fn driver_runtime() -> tokio::runtime::Builder {
    let mut runtime = tokio::runtime::Builder::new_current_thread();
    runtime.max_blocking_threads(BLOCKING_THREADS);
    runtime
}

/// The allocator a driver's binary declares as its `#[global_allocator]`
/// (only a program can choose it): dlmalloc, one heap behind one lock.
/// glibc's malloc keeps a cache of freed chunks per thread, and under
/// concurrent load those caches fragmented the heap to several times its
/// live size; the one lock costs little at a node plugin's call rates.
/// glibc's malloc still serves libc's own allocations, in the one arena
/// [`limit_malloc_arenas`] leaves it.
pub use dlmalloc::GlobalDlmalloc as Allocator;

/// Limits glibc's malloc to one arena. By default it creates one per thread
/// that allocates (up to eight per core), each keeping its own free memory.
/// Called by [`run_to_exit`](super::run_to_exit) before the runtime starts
/// its threads; a no-op on other C libraries.
pub fn limit_malloc_arenas() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt takes malloc's own lock; M_ARENA_MAX only bounds the
    // arenas created from now on.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::{Arc, Barrier, Mutex};

    #[test]
    fn the_async_part_runs_on_the_caller_and_blocking_work_on_a_bounded_pool() {
        limit_malloc_arenas();
        let runtime = driver_runtime().enable_all().build().unwrap();
        let caller = std::thread::current().id();
        let (async_thread, pool) = runtime.block_on(async {
            // All of the pool at once: the barrier opens only when
            // BLOCKING_THREADS jobs run side by side.
            let barrier = Arc::new(Barrier::new(BLOCKING_THREADS));
            let seen = Arc::new(Mutex::new(HashSet::new()));
            let jobs: Vec<_> = (0..4 * BLOCKING_THREADS)
                .map(|i| {
                    let (barrier, seen) = (barrier.clone(), seen.clone());
                    tokio::task::spawn_blocking(move || {
                        if i < BLOCKING_THREADS {
                            barrier.wait();
                        }
                        seen.lock().unwrap().insert(std::thread::current().id());
                    })
                })
                .collect();
            for job in jobs {
                job.await.unwrap();
            }
            let pool = seen.lock().unwrap().clone();
            (std::thread::current().id(), pool)
        });
        assert_eq!(async_thread, caller);
        assert_eq!(pool.len(), BLOCKING_THREADS, "{pool:?}");
        assert!(!pool.contains(&caller));
    }
}
