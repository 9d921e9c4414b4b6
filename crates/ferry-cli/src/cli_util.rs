//! What every subcommand shares at the edges: checked argument values, the group opened
//! with its path named in any error, errors told in words a user can act on, and a
//! closed stdout taken as the reader having seen enough.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Result;

/// The longest wait a duration argument may ask for: a day. Longer is almost surely a
/// typo, and far longer does not fit a `Duration` deadline.
pub const MAX_SECS: f64 = 86_400.0;

/// Parses a number of seconds, 0 to [`MAX_SECS`] (a clap value parser).
pub fn parse_secs(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !secs.is_finite() {
        return Err(format!("{s:?} is not a finite number of seconds"));
    }
    if secs < 0.0 {
        return Err(format!("{s:?}: seconds cannot be negative"));
    }
    if secs > MAX_SECS {
        return Err(format!("{s:?}: at most {MAX_SECS} seconds (a day)"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Whether the error (or one of its causes) is a write to a pipe or socket whose reader
/// went away.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
            || matches!(c.downcast_ref::<ferry::Error>(), Some(ferry::Error::Io(io))
                if io.kind() == io::ErrorKind::BrokenPipe)
    })
}

/// The error as one line for the user, preceded by what to do about a shortage of file
/// descriptors when that is the cause.
pub fn describe(e: &anyhow::Error) -> String {
    let errno = e.chain().find_map(|c| {
        c.downcast_ref::<io::Error>()
            .and_then(io::Error::raw_os_error)
            .or_else(|| match c.downcast_ref::<ferry::Error>() {
                Some(ferry::Error::Io(io)) => io.raw_os_error(),
                _ => None,
            })
    });
    let text = chain_text(e);
    match errno {
        Some(libc::EMFILE) => {
            let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
                .current
                .map_or_else(|| "unlimited".to_owned(), |n| n.to_string());
            format!("too few file descriptors (ulimit -n is {limit}): {text}")
        }
        Some(libc::ENFILE) => format!("the system is out of file descriptors: {text}"),
        _ => text,
    }
}

/// The error and its causes joined by `: `, leaving out a cause that its error already
/// quotes (a `ferry::Error::Io` shows its `io::Error`, which is also its source).
fn chain_text(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for c in e.chain() {
        let t = c.to_string();
        if !parts.last().is_some_and(|p| p.ends_with(&t)) {
            parts.push(t);
        }
    }
    parts.join(": ")
}

/// Set when a `print!` found stdout closed (see [`quiet_closed_stdout`]).
static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// Makes the panic that `print!`/`println!` raise on a closed stdout (`EPIPE`: the
/// reader, e.g. `head`, has exited) silent and noted, so that `main` can end the command
/// with status 0 as coreutils' tools do, after unwinding has run the destructors. Every
/// other panic is reported as before.
pub fn quiet_closed_stdout() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if is_closed_stdout_panic(info.payload()) {
            STDOUT_CLOSED.store(true, Ordering::Relaxed);
        } else {
            report(info);
        }
    }));
}

/// Whether a panic so far was `print!` finding stdout closed.
pub fn stdout_was_closed() -> bool {
    STDOUT_CLOSED.load(Ordering::Relaxed)
}

fn is_closed_stdout_panic(p: &(dyn std::any::Any + Send)) -> bool {
    let msg = p
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| p.downcast_ref::<&str>().copied())
        .unwrap_or("");
    // std's `print!` panics with "failed printing to stdout: <the io::Error>".
    msg.starts_with("failed printing to stdout")
        && msg.contains(&io::Error::from_raw_os_error(libc::EPIPE).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_checked() {
        assert_eq!(parse_secs("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_secs("0"), Ok(Duration::ZERO));
        for bad in ["nan", "inf", "-inf", "-1", "1e300", "86401", "", "soon"] {
            assert!(parse_secs(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn broken_pipes_are_recognised_through_context() {
        let e = anyhow::Error::from(io::Error::from(io::ErrorKind::BrokenPipe))
            .context("writing a message");
        assert!(is_broken_pipe(&e));
        let e = anyhow::Error::from(ferry::Error::Io(io::Error::from_raw_os_error(libc::EPIPE)));
        assert!(is_broken_pipe(&e));
        assert!(!is_broken_pipe(&anyhow::anyhow!("other")));
    }

    #[test]
    fn descriptor_shortage_is_told_plainly() {
        let e = anyhow::Error::from(ferry::Error::Io(io::Error::from_raw_os_error(libc::EMFILE)))
            .context("subscribing");
        assert!(
            describe(&e).starts_with("too few file descriptors (ulimit -n is "),
            "{}",
            describe(&e)
        );
    }
}
