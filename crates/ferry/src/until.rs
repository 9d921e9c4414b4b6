//! How long a blocking call may wait, and how its caller can stop it early.

use std::fmt;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// When a blocking call gives up: at its deadline, with [`Error::Timeout`], or as soon
/// as a check its caller hands it says to stop, with [`Error::Interrupted`].
///
/// The call runs the check between its sleeps, which last at most
/// [`CHECK_EVERY`](Self::CHECK_EVERY) each. This is how a binding honours its host's
/// interrupts (Python's Ctrl-C) in waits that cannot be cut into shorter calls because
/// they have steps with effects on both sides: a handshake (an offer made, a membership
/// taken) or a request sent. Whatever the call had set up is undone on `Interrupted` as
/// on `Timeout`.
///
/// ```no_run
/// # fn demo(d: &ferry::Domain, peer: ferry::DomainId) -> ferry::Result<()> {
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use std::time::Duration;
/// static STOP: AtomicBool = AtomicBool::new(false);
/// let mut stop = || STOP.load(Ordering::Relaxed);
/// let until = ferry::Until::timeout(Duration::from_secs(30)).with_stop(&mut stop);
/// let tx = d.connect_until(peer, ferry::ChannelConfig::default(), until)?;
/// # Ok(()) }
/// ```
pub struct Until<'a> {
    deadline: Option<Instant>,
    stop: Option<&'a mut (dyn FnMut() -> bool + 'a)>,
}

impl fmt::Debug for Until<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Until")
            .field("deadline", &self.deadline)
            .field("stop", &self.stop.is_some())
            .finish()
    }
}

impl Until<'static> {
    /// Until `deadline` (`None`: no limit), with no stop check.
    pub fn deadline(deadline: Option<Instant>) -> Self {
        Until {
            deadline,
            stop: None,
        }
    }

    /// For `timeout` from now, with no stop check.
    pub fn timeout(timeout: Duration) -> Self {
        // A timeout too long to add to now is no limit.
        Self::deadline(Instant::now().checked_add(timeout))
    }
}

impl<'a> Until<'a> {
    /// The longest a call sleeps between two runs of the stop check.
    pub const CHECK_EVERY: Duration = Duration::from_millis(100);

    /// The same limit, and `stop` to run between sleeps: once it returns true the call
    /// gives up with [`Error::Interrupted`].
    pub fn with_stop<'b>(self, stop: &'b mut (dyn FnMut() -> bool + 'b)) -> Until<'b>
    where
        'a: 'b,
    {
        Until {
            deadline: self.deadline,
            stop: Some(stop),
        }
    }

    /// The deadline, if any.
    pub fn deadline_at(&self) -> Option<Instant> {
        self.deadline
    }

    /// How long the caller may sleep before it should [`check`](Self::check) again:
    /// what is left until the deadline, at most [`CHECK_EVERY`](Self::CHECK_EVERY)
    /// (zero once the deadline has passed).
    pub fn slice(&self) -> Duration {
        match self.deadline {
            Some(d) => d
                .saturating_duration_since(Instant::now())
                .min(Self::CHECK_EVERY),
            None => Self::CHECK_EVERY,
        }
    }

    /// Whether to go on waiting: [`Error::Timeout`] once the deadline has passed,
    /// [`Error::Interrupted`] if the stop check says to stop.
    ///
    /// # Errors
    /// As above.
    pub fn check(&mut self) -> Result<()> {
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(Error::Timeout);
        }
        if let Some(stop) = &mut self.stop {
            if stop() {
                return Err(Error::Interrupted);
            }
        }
        Ok(())
    }

    /// Runs `step(slice)` until it returns anything but [`Error::Timeout`], giving it at
    /// most [`slice`](Self::slice) each time and running [`check`](Self::check) in
    /// between: a wait that takes a timeout, made to honour this limit and stop check.
    /// `step` must have no effect when it times out.
    ///
    /// # Errors
    /// `step`'s, or [`check`](Self::check)'s.
    pub fn sliced<T>(mut self, mut step: impl FnMut(Duration) -> Result<T>) -> Result<T> {
        self.sliced_mut(&mut step)
    }

    fn sliced_mut<T>(&mut self, step: &mut dyn FnMut(Duration) -> Result<T>) -> Result<T> {
        loop {
            match step(self.slice()) {
                Err(Error::Timeout) => self.check()?,
                done => return done,
            }
        }
    }

    /// This limit and stop check, for one part of a call (the stop check is lent).
    pub(crate) fn part(&mut self) -> Until<'_> {
        Until {
            deadline: self.deadline,
            stop: match &mut self.stop {
                Some(s) => Some(&mut **s),
                None => None,
            },
        }
    }

    /// Like [`part`](Self::part), for a part that must be given at least `patience`
    /// from now even if the deadline is nearer.
    pub(crate) fn part_at_least(&mut self, patience: Duration) -> Until<'_> {
        let floor = Instant::now() + patience;
        let mut p = self.part();
        p.deadline = p.deadline.map(|d| d.max(floor));
        p
    }
}

impl From<Option<Instant>> for Until<'static> {
    fn from(deadline: Option<Instant>) -> Self {
        Until::deadline(deadline)
    }
}
