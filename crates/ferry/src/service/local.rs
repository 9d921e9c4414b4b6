//! Location transparency: a [`Handler`] written once, called through a [`Caller`] that
//! runs it either in the caller's own process (a plain function call: no ring, no
//! copy, no other process) or in a server process (through a [`Client`]), as
//! [`Placement`] says. Only the configuration changes, never the handler or the code
//! that calls it.
//!
//! This follows the "separating modularity from protection" argument of Druschel's
//! thesis (chapter 4): where a module runs, and so whether a protection boundary lies
//! between it and its caller, should be a deployment decision, because the data passing
//! underneath (fbufs) costs about the same either way.

use std::time::Duration;

use super::reqresp::{Client, Server};
use super::ServiceConfig;
use crate::error::{Error, Result};
use crate::iodata::IoData;
use crate::region::{Domain, PathAllocator, PathConfig};

/// A request handler: takes a request's payload, returns the response, allocating
/// what it writes from `out` (the running domain's lot, so that the response crosses
/// to a remote caller without a copy).
pub trait Handler: Send {
    /// Handles one request.
    fn handle(&mut self, request: &IoData, out: &PathAllocator) -> Result<IoData>;
}

impl<F> Handler for F
where
    F: FnMut(&IoData, &PathAllocator) -> Result<IoData> + Send,
{
    fn handle(&mut self, request: &IoData, out: &PathAllocator) -> Result<IoData> {
        self(request, out)
    }
}

/// Where a handler runs.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// In the caller's process, as a function call.
    InProcess,
    /// In the process that offers the service (see [`run_server`]).
    Remote,
}

impl std::str::FromStr for Placement {
    type Err = Error;
    /// `"in-process"` (or `"local"`) and `"remote"` (or `"process"`), so that a
    /// placement can come from a configuration file, flag or environment variable.
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "in-process" | "local" => Ok(Placement::InProcess),
            "remote" | "process" => Ok(Placement::Remote),
            _ => Err(Error::InvalidArgument(
                "placement is \"in-process\" or \"remote\"",
            )),
        }
    }
}

enum Via {
    Local {
        handler: Box<dyn Handler>,
        path: PathAllocator,
    },
    Remote(Box<Client>),
}

/// Calls a handler wherever [`Placement`] put it.
pub struct Caller {
    via: Via,
}

impl std::fmt::Debug for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.via {
            Via::Local { .. } => f.write_str("Caller(in-process)"),
            Via::Remote(c) => write!(f, "Caller(remote {:?})", c.server()),
        }
    }
}

impl Caller {
    /// A caller for service `name` placed as `placement`. In process, `make` builds
    /// the handler here; remotely, `make` is not called and the service's server (a
    /// process running [`run_server`] with the same handler) is looked up by name,
    /// waiting up to `timeout`.
    pub fn bind<H: Handler + 'static>(
        domain: &Domain,
        name: &str,
        placement: Placement,
        make: impl FnOnce() -> H,
        timeout: Duration,
    ) -> Result<Caller> {
        match placement {
            Placement::InProcess => Caller::local(domain, make()),
            Placement::Remote => Caller::remote(domain, name, timeout),
        }
    }

    /// A caller that runs `handler` in this process, allocating from `domain`'s lot.
    pub fn local(domain: &Domain, handler: impl Handler + 'static) -> Result<Caller> {
        Ok(Caller {
            via: Via::Local {
                handler: Box::new(handler),
                path: domain.path(PathConfig::default())?,
            },
        })
    }

    /// A caller of the server offering `name`.
    pub fn remote(domain: &Domain, name: &str, timeout: Duration) -> Result<Caller> {
        Ok(Caller {
            via: Via::Remote(Box::new(Client::open(domain, name, timeout)?)),
        })
    }

    /// Calls the handler with `request`. In process this is a direct call (the
    /// timeout does not apply); remotely, [`Client::call`].
    ///
    /// # Errors
    /// The handler's own error in process; remotely [`Error::RequestFailed`] for a
    /// handler error, [`Error::Timeout`], [`Error::PeerGone`].
    pub fn call(&mut self, request: &IoData, timeout: Duration) -> Result<IoData> {
        match &mut self.via {
            Via::Local { handler, path } => handler.handle(request, path),
            Via::Remote(c) => c.call(request, timeout),
        }
    }

    /// True if calls run in this process.
    pub fn is_local(&self) -> bool {
        matches!(self.via, Via::Local { .. })
    }
}

/// Offers `name` from `domain` and serves requests with `handler` until `keep_going`
/// returns false (checked between requests and at least every 100 ms).
pub fn run_server(
    domain: &Domain,
    name: &str,
    config: ServiceConfig,
    handler: &mut dyn Handler,
    mut keep_going: impl FnMut(&Server) -> bool,
) -> Result<()> {
    let mut server = Server::offer(domain, name, config)?;
    while keep_going(&server) {
        match server.serve_one(handler, Duration::from_millis(100)) {
            Ok(()) | Err(Error::Timeout) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
