//! The process's effect counter and what it does at the planned effect.

/// Whether this process counts its effects: built with the `armed` feature
/// and started with [`CRASH_AT_ENV`](crate::CRASH_AT_ENV) or
/// [`CRASH_TRACE_ENV`](crate::CRASH_TRACE_ENV) set. The first call reads
/// the environment; a plan that does not parse ends the process with
/// status 2 and the reason on stderr, as a bad flag would.
pub fn armed() -> bool {
    armed::hook().is_some()
}

/// Makes one effect, `f`, as the next numbered step: traced as `kind` (a
/// short name such as `provider-attach`, never an argument), and the
/// process killed before or after it when the plan names it. Without the
/// hook, just `f()`.
pub fn effect<T>(kind: &str, f: impl FnOnce() -> T) -> T {
    match armed::hook() {
        Some(hook) => {
            let planned = hook.begin(kind);
            let made = f();
            hook.end(planned);
            made
        }
        None => f(),
    }
}

/// [`effect`] for an effect that is awaited (a call to a remote service):
/// the kill before it comes before `f` is first polled, the kill after it
/// once `f` is done.
pub async fn effect_async<F: Future>(kind: &str, f: F) -> F::Output {
    match armed::hook() {
        Some(hook) => {
            let planned = hook.begin(kind);
            let made = f.await;
            hook.end(planned);
            made
        }
        None => f.await,
    }
}

#[cfg(feature = "armed")]
mod armed {
    use std::fs::{File, OpenOptions};
    use std::io::Write;
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};

    use crate::plan::{CRASH_AT_ENV, CRASH_TRACE_ENV, CrashPlan, When};

    pub(super) struct Hook {
        plan: Option<CrashPlan>,
        trace: Option<File>,
        made: AtomicU64,
    }

    static HOOK: OnceLock<Option<Hook>> = OnceLock::new();

    pub(super) fn hook() -> Option<&'static Hook> {
        HOOK.get_or_init(from_env).as_ref()
    }

    fn from_env() -> Option<Hook> {
        let plan = std::env::var_os(CRASH_AT_ENV);
        let trace = std::env::var_os(CRASH_TRACE_ENV);
        if plan.is_none() && trace.is_none() {
            return None;
        }
        let plan = plan.map(|p| match p.to_string_lossy().parse::<CrashPlan>() {
            Ok(plan) => plan,
            Err(e) => fail(&e.to_string()),
        });
        let trace = trace.map(|path| {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .unwrap_or_else(|e| fail(&format!("{CRASH_TRACE_ENV}: {e}")))
        });
        Some(Hook {
            plan,
            trace,
            made: AtomicU64::new(0),
        })
    }

    fn fail(why: &str) -> ! {
        // Straight to the descriptor: a test harness capturing `eprintln!`
        // would lose the reason when the process exits.
        let _ = writeln!(std::io::stderr(), "crash points: {why}");
        std::process::exit(2)
    }

    impl Hook {
        /// Numbers and traces the next effect, killing the process if the
        /// plan names the moment before it; what the plan says of it.
        pub(super) fn begin(&self, kind: &str) -> Option<When> {
            let step = self.made.fetch_add(1, Ordering::SeqCst) + 1;
            if let Some(mut trace) = self.trace.as_ref() {
                // One append per line: a kill never leaves half of one
                // behind another's.
                let _ = trace.write_all(format!("{step} {kind}\n").as_bytes());
            }
            let planned = self.plan.filter(|p| p.step == step).map(|p| p.when);
            if planned == Some(When::Before) {
                kill();
            }
            planned
        }

        /// After the effect: the kill the plan names for the moment after it.
        pub(super) fn end(&self, planned: Option<When>) {
            if planned == Some(When::After) {
                kill();
            }
        }
    }

    /// SIGKILL of this process: no handler, destructor or flush runs, as
    /// when the node loses the process.
    fn kill() -> ! {
        // SAFETY: kill(2) of our own pid; no memory is involved.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
        std::process::abort()
    }
}

#[cfg(not(feature = "armed"))]
mod armed {
    use crate::plan::When;

    /// Never built: the hook does not exist without the feature.
    pub(super) enum Hook {}

    impl Hook {
        pub(super) fn begin(&self, _: &str) -> Option<When> {
            match *self {}
        }

        pub(super) fn end(&self, _: Option<When>) {
            match *self {}
        }
    }

    pub(super) fn hook() -> Option<&'static Hook> {
        None
    }
}
