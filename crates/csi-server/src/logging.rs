//! Logging setup for a driver's `main`.

use std::io::IsTerminal;

use tracing::level_filters::LevelFilter;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

/// Logs to stderr with `RUST_LOG` as the filter, or `default_filter`
/// when it is unset; colours only on a terminal. A filter is a level
/// (`info`) or `target=level` pairs with an optional bare default
/// (`my_driver=debug,info`); one that does not parse is reported on stderr
/// and the next one is used (`RUST_LOG`, `default_filter`, `info`). Secrets
/// never reach the log: requests are logged through csi-proto's redacting
/// `Debug`. Does nothing if a subscriber is already installed.
pub fn init_tracing(default_filter: &str) {
    let filter = log_filter(std::env::var("RUST_LOG").ok().as_deref(), default_filter);
    let _ = subscriber(filter).try_init();
}

fn subscriber(filter: Targets) -> impl tracing::Subscriber + Send + Sync {
    tracing_subscriber::fmt()
        // The builder's own filter defaults to INFO. Set to the most verbose
        // level `filter` passes, it becomes the process's maximum level,
        // so a disabled `debug!` or `trace!` in any crate (h2 and hyper
        // have many on every frame) returns before its callsite is read.
        .with_max_level(most_verbose(&filter))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .finish()
        .with(filter)
}

/// The filter's own hint: the most verbose level any of its directives passes.
fn most_verbose(filter: &Targets) -> LevelFilter {
    let hint = <Targets as Layer<tracing_subscriber::Registry>>::max_level_hint(filter);
    hint.unwrap_or(LevelFilter::OFF)
}

// `Targets`, not `EnvFilter`: its span and field directives need a regex
// engine, which was the largest part of a driver's code no call uses, and a
// node plugin's resident code is most of its memory.
fn log_filter(env: Option<&str>, default_filter: &str) -> Targets {
    let candidates = [
        ("RUST_LOG", env),
        ("the default log filter", Some(default_filter)),
    ];
    for (source, text) in candidates {
        let Some(text) = text.filter(|t| !t.trim().is_empty()) else {
            continue;
        };
        match text.parse::<Targets>() {
            Ok(filter) => return filter,
            Err(e) => eprintln!("{source} {text:?} ignored: {e}"),
        }
    }
    Targets::new().with_default(tracing::Level::INFO)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Subscriber;

    #[test]
    fn the_maximum_level_is_the_filters_most_verbose() {
        for (text, most) in [
            ("warn", LevelFilter::WARN),
            ("my_driver=debug,warn", LevelFilter::DEBUG),
            ("h2=trace", LevelFilter::TRACE),
            ("error,my_driver=off", LevelFilter::ERROR),
        ] {
            let hint = subscriber(log_filter(Some(text), "info")).max_level_hint();
            assert_eq!(hint, Some(most), "{text}");
        }
    }

    #[test]
    fn rust_log_wins_then_the_default_then_info() {
        let filter = log_filter(Some("my_driver=debug,warn"), "error");
        assert_eq!(filter.default_level(), Some(LevelFilter::WARN));
        assert!(filter.would_enable("my_driver::node", &tracing::Level::DEBUG));
        assert!(!filter.would_enable("h2", &tracing::Level::INFO));

        let filter = log_filter(None, "debug");
        assert_eq!(filter.default_level(), Some(LevelFilter::DEBUG));
        let filter = log_filter(Some("  "), "error");
        assert_eq!(filter.default_level(), Some(LevelFilter::ERROR));
    }

    #[test]
    fn a_filter_that_does_not_parse_falls_back() {
        let filter = log_filter(Some("x=loud"), "warn");
        assert_eq!(filter.default_level(), Some(LevelFilter::WARN));
        let filter = log_filter(Some("x=loud"), "y=louder");
        assert_eq!(filter.default_level(), Some(LevelFilter::INFO));
    }
}
