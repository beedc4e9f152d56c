//! Group commit of directory syncs.
//!
//! A write is durable once the rename that published it is on disk, which
//! takes an fsync of the directory. One fsync covers every rename made
//! before it started, so concurrent writers share them: a writer joins the
//! pending batch; if no sync is running it leads the batch (runs the sync
//! for everyone in it), otherwise it waits, and when the running sync ends
//! one waiter of the next batch leads it. With N writers arriving together
//! that is about two syncs, not N.

use std::io;
#[cfg(test)]
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

/// Shared syncs of one directory.
#[derive(Debug, Default)]
pub(crate) struct GroupSync {
    state: Mutex<State>,
    syncs: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    running: bool,
    pending: Arc<Batch>,
}

/// The writers one sync covers. Each batch has its own condition variable
/// (all used with `GroupSync::state`), so a finished sync wakes its own
/// members and one member of the next batch to lead it, not every waiter.
#[derive(Debug, Default)]
struct Batch {
    /// `Err` holds the errno (or kind and text) so every member can get
    /// its own copy of the error.
    result: OnceLock<Result<(), SharedError>>,
    wake: Condvar,
    #[cfg(test)]
    members: AtomicUsize,
}
#[derive(Debug, Clone)]
enum SharedError {
    Os(i32),
    Other(io::ErrorKind, String),
}

impl SharedError {
    fn of(e: &io::Error) -> Self {
        match e.raw_os_error() {
            Some(n) => SharedError::Os(n),
            None => SharedError::Other(e.kind(), e.to_string()),
        }
    }

    fn to_io(&self) -> io::Error {
        match self {
            SharedError::Os(n) => io::Error::from_raw_os_error(*n),
            SharedError::Other(kind, text) => io::Error::new(*kind, text.clone()),
        }
    }
}

impl GroupSync {
    /// Returns once a call of `sync` that started after this call began has
    /// finished, with its result. `sync` runs in this thread if it leads a
    /// batch, and not at all otherwise.
    pub(crate) fn sync(&self, sync: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
        let mut state = self.lock();
        let batch = state.pending.clone();
        #[cfg(test)]
        batch.members.fetch_add(1, Ordering::SeqCst);
        loop {
            if let Some(result) = batch.result.get() {
                return result.clone().map_err(|e| e.to_io());
            }
            if !state.running {
                // Our batch has not started (a started batch is no longer
                // pending and has a result before `running` is cleared), so
                // it is still the pending one: lead it.
                state.running = true;
                state.pending = Arc::new(Batch::default());
                drop(state);
                let result = sync();
                self.syncs.fetch_add(1, Ordering::Relaxed);
                let _ = batch
                    .result
                    .set(result.as_ref().map(|_| ()).map_err(SharedError::of));
                let mut state = self.lock();
                state.running = false;
                batch.wake.notify_all();
                state.pending.wake.notify_one();
                drop(state);
                return result;
            }
            state = batch.wake.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// How many syncs ran.
    pub(crate) fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[cfg(test)]
    fn pending_members(&self) -> usize {
        self.lock().pending.members.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
        let start = Instant::now();
        while !cond() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "timed out: {what}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A writer whose sync runs until `release` is sent, started and seen
    /// to be syncing, so later writers arrive during its sync.
    fn a_held_sync(
        gs: &Arc<GroupSync>,
    ) -> (std::thread::JoinHandle<io::Result<()>>, mpsc::Sender<()>) {
        let (release, held) = mpsc::channel::<()>();
        let started = Arc::new(AtomicU64::new(0));
        let first = {
            let (gs, started) = (gs.clone(), started.clone());
            std::thread::spawn(move || {
                gs.sync(|| {
                    started.fetch_add(1, Ordering::SeqCst);
                    held.recv().unwrap();
                    Ok(())
                })
            })
        };
        wait_for("the first sync to start", || {
            started.load(Ordering::SeqCst) == 1
        });
        (first, release)
    }

    #[test]
    fn writers_that_arrive_during_a_sync_share_the_next_one() {
        let gs = Arc::new(GroupSync::default());
        let (first, release) = a_held_sync(&gs);

        // Seven more arrive while it runs: all join the pending batch.
        let ran = Arc::new(AtomicU64::new(0));
        let others: Vec<_> = (0..7)
            .map(|_| {
                let (gs, ran) = (gs.clone(), ran.clone());
                std::thread::spawn(move || {
                    gs.sync(|| {
                        ran.fetch_add(1, Ordering::SeqCst);
                        Ok(())
                    })
                })
            })
            .collect();
        wait_for("seven waiters", || gs.pending_members() == 7);
        release.send(()).unwrap();

        first.join().unwrap().unwrap();
        for t in others {
            t.join().unwrap().unwrap();
        }
        assert_eq!(ran.load(Ordering::SeqCst), 1, "7 writers, 1 sync");
        assert_eq!(gs.syncs(), 2);
    }

    #[test]
    fn every_member_of_a_failed_batch_gets_the_error() {
        let gs = Arc::new(GroupSync::default());
        let (first, release) = a_held_sync(&gs);
        let failing: Vec<_> = (0..3)
            .map(|_| {
                let gs = gs.clone();
                std::thread::spawn(move || gs.sync(|| Err(io::Error::from_raw_os_error(libc::EIO))))
            })
            .collect();
        wait_for("three waiters", || gs.pending_members() == 3);
        release.send(()).unwrap();
        first.join().unwrap().unwrap();
        for t in failing {
            let e = t.join().unwrap().unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EIO));
        }
        // The next batch starts clean.
        gs.sync(|| Ok(())).unwrap();
    }

    #[test]
    fn a_lone_writer_syncs_at_once() {
        let gs = GroupSync::default();
        for _ in 0..3 {
            gs.sync(|| Ok(())).unwrap();
        }
        assert_eq!(gs.syncs(), 3);
    }
}
