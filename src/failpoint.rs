//! Failpoints for fault tests, active only with the `failpoints` feature (release builds
//! have none: without the feature, [`fail::fail_point!`] expands to nothing).
//!
//! Points: `before_commit` (inside an inbox transaction, just before COMMIT),
//! `after_commit_before_offset` (COMMIT done, offset not stored), `after_offset_store` (offset
//! stored, not yet committed to Kafka), `after_offset_commit` (Kafka confirmed an offset
//! commit). Configure them with the `FAILPOINTS` environment variable of the `fail` crate, e.g.
//! `FAILPOINTS='before_commit=2*off->return(crash)'`. The action argument is `crash`: the process
//! aborts on the spot, like `kill -9` (no destructor, no offset commit, no COMMIT); or
//! `delay_crash:<ms>`: the thread stalls that long first (the client's other threads, such as
//! the offset auto-commit, go on), then the process aborts.

/// Aborts the process when failpoint `name` fires with `return(crash)`; any other argument is a
/// configuration error and aborts too, loudly, so a test cannot silently run without its fault.
#[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
pub(crate) fn crash(name: &str, arg: Option<String>) -> ! {
    let arg = arg.unwrap_or_default();
    if let Some(ms) = arg.strip_prefix("delay_crash:") {
        match ms.parse::<u64>() {
            Ok(ms) => std::thread::sleep(std::time::Duration::from_millis(ms)),
            Err(_) => eprintln!("failpoint {name}: bad delay {ms:?}"),
        }
    } else if arg != "crash" {
        eprintln!("failpoint {name}: unknown action argument {arg:?}");
    }
    eprintln!("failpoint {name}: crashing");
    std::process::abort()
}

/// Evaluates failpoint `$name` (a string literal); see the module documentation.
macro_rules! failpoint {
    ($name:literal) => {
        fail::fail_point!($name, |arg| $crate::failpoint::crash($name, arg))
    };
}
pub(crate) use failpoint;
