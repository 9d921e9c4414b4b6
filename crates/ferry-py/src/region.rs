//! Groups, domains and paths.

use std::sync::Arc;

use ferry::{ChannelConfig, DomainId, GroupConfig, PathConfig};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::channel::{PyReceiver, PySender};
use crate::errors::raise;
use crate::handle::{closable, Handle};
use crate::path::PyPath;
use crate::wait::interruptible;

/// The domain behind a Python `Domain` argument.
pub(crate) fn domain_of(obj: &Bound<'_, PyAny>) -> PyResult<ferry::Domain> {
    obj.cast::<PyDomain>()?.get().inner.get()
}

/// A named group of processes that share lots (`/dev/shm/ferry.<name>`).
#[pyclass(module = "ferry._ferry", name = "Group", frozen)]
pub struct PyGroup {
    inner: Handle<Arc<ferry::Group>>,
}

closable! {
    PyGroup {
        /// Opens (creating if needed) the group `name`.
        #[new]
        #[pyo3(signature = (name, *, lot_size = None, base_addr = None))]
        fn new(
            py: Python<'_>,
            name: &str,
            lot_size: Option<usize>,
            base_addr: Option<usize>,
        ) -> PyResult<Self> {
            let mut config = GroupConfig::default();
            if let Some(l) = lot_size {
                config.lot_size = l;
            }
            config.base_addr = base_addr;
            let name = name.to_owned();
            let g = py
                .detach(|| ferry::Group::open_with(&name, config))
                .map_err(raise)?;
            Ok(PyGroup {
                inner: Handle::new("Group", g),
            })
        }

        /// The group's name.
        #[getter]
        fn name(&self) -> PyResult<String> {
            Ok(self.inner.get()?.name().to_owned())
        }

        /// Path of the group's named file.
        #[getter]
        fn path(&self) -> PyResult<String> {
            Ok(self.inner.get()?.file_path().display().to_string())
        }

        /// Size in bytes of each domain's lot.
        #[getter]
        fn lot_size(&self) -> PyResult<usize> {
            Ok(self.inner.get()?.lot_size())
        }

        /// Address of slot `slot`'s lot (the same in every process of the group).
        fn lot_addr(&self, slot: u16) -> PyResult<usize> {
            Ok(self.inner.get()?.lot_addr(slot))
        }

        /// Live members as `(domain id, pid)` pairs.
        fn members(&self) -> PyResult<Vec<(String, u32)>> {
            Ok(self
                .inner
                .get()?
                .members()
                .into_iter()
                .map(|m| (m.id.to_string(), m.pid))
                .collect())
        }

        /// The services offered in the group by live domains, as dicts: `name`, `kind`
        /// (`"pubsub"` or `"reqresp"`), `owner` and `members` (`(domain id, pid)`), `depth`,
        /// `slow`, and where it lives: `origin` (`"local"`, `"bridged"` from another host,
        /// `"carried"` to others by a bridge, or `"damaged"`), `far` (the far end(s) the
        /// bridge recorded, or None) and `bridge` (the carrying member, or None).
        fn services<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
            services(py, &*self.inner.get()?)
        }

        /// Makes this process a member: claims a slot and creates its lot.
        fn join(&self, py: Python<'_>) -> PyResult<PyDomain> {
            let g = self.inner.get()?;
            let d = py.detach(|| g.join()).map_err(raise)?;
            Ok(PyDomain {
                inner: Handle::new("Domain", d),
            })
        }

        fn __repr__(&self) -> String {
            match self.inner.get() {
                Ok(g) => format!("<ferry.Group {:?}>", g.name()),
                Err(_) => "<ferry.Group (closed)>".into(),
            }
        }
    }
}

/// This process's membership of a group: its lot, its paths and its channels.
#[pyclass(module = "ferry._ferry", name = "Domain", frozen)]
pub struct PyDomain {
    inner: Handle<ferry::Domain>,
}

closable! {
    PyDomain {
        /// This domain's id (`"SLOT.GENERATION"`), to hand to peers that connect to it.
        #[getter]
        fn id(&self) -> PyResult<String> {
            Ok(self.inner.get()?.id().to_string())
        }

        /// Address of this domain's lot.
        #[getter]
        fn lot_addr(&self) -> PyResult<usize> {
            Ok(self.inner.get()?.lot_addr())
        }

        /// Size of this domain's lot in bytes.
        #[getter]
        fn lot_size(&self) -> PyResult<usize> {
            Ok(self.inner.get()?.group().lot_size())
        }

        /// A new path allocator carving fbufs from this domain's lot.
        ///
        /// `quota` bounds the bytes the path may have out at once (default 512 MiB);
        /// `secure` write-protects sent fbufs in this process until every receiver released
        /// them.
        #[pyo3(signature = (*, quota = None, secure = false))]
        fn path(&self, quota: Option<usize>, secure: bool) -> PyResult<PyPath> {
            let mut config = PathConfig::default();
            if let Some(q) = quota {
                config.quota = q;
            }
            config.secure = secure;
            let p = self.inner.get()?.path(config).map_err(raise)?;
            Ok(PyPath { inner: p })
        }

        /// Opens a channel to the domain `peer` (its id string), which must be in
        /// `accept`. Raises `Timeout` if it does not answer within `timeout` seconds
        /// (`None`: no limit).
        #[pyo3(signature = (peer, timeout = 5.0, *, capacity = None, release_capacity = None))]
        fn connect(
            &self,
            py: Python<'_>,
            peer: &str,
            timeout: Option<f64>,
            capacity: Option<u32>,
            release_capacity: Option<u32>,
        ) -> PyResult<PySender> {
            let peer: DomainId = peer.parse().map_err(raise)?;
            let mut config = ChannelConfig::default();
            if let Some(c) = capacity {
                config.capacity = c;
            }
            if let Some(c) = release_capacity {
                config.release_capacity = c;
            }
            let d = self.inner.get()?;
            let tx = interruptible(py, timeout, |until| d.connect_until(peer, config, until))?;
            Ok(PySender::new(tx, d))
        }

        /// Waits up to `timeout` seconds (`None`: no limit) for a peer to connect; raises
        /// `Timeout` if none does.
        #[pyo3(signature = (timeout = 5.0))]
        fn accept(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<PyReceiver> {
            let d = self.inner.get()?;
            let rx = interruptible(py, timeout, |until| d.accept_until(until))?;
            Ok(PyReceiver::new(rx))
        }

        /// Drains pending releases of every channel this domain sends on.
        fn collect_releases(&self, py: Python<'_>) -> PyResult<()> {
            let d = self.inner.get()?;
            py.detach(|| d.collect_releases());
            Ok(())
        }

        /// Number of other domains' lots mapped in this process.
        #[getter]
        fn mapped_peers(&self) -> PyResult<usize> {
            Ok(self.inner.get()?.mapped_peers())
        }

        fn __repr__(&self) -> String {
            match self.inner.get() {
                Ok(d) => format!("<ferry.Domain {}>", d.id()),
                Err(_) => "<ferry.Domain (closed)>".into(),
            }
        }
    }
}

/// A member as Python sees it: `(domain id, pid)`.
pub(crate) fn member(m: ferry::Member) -> (String, u32) {
    (m.id.to_string(), m.pid)
}

/// `group.services()`: the services offered in the group.
fn services<'py>(py: Python<'py>, g: &ferry::Group) -> PyResult<Vec<Bound<'py, PyDict>>> {
    g.services()
        .into_iter()
        .map(|s| {
            let d = PyDict::new(py);
            d.set_item("name", s.name)?;
            d.set_item(
                "kind",
                match s.kind {
                    ferry::ServiceKind::PubSub => "pubsub",
                    _ => "reqresp",
                },
            )?;
            d.set_item("owner", member(s.owner))?;
            d.set_item(
                "members",
                s.subscribers.into_iter().map(member).collect::<Vec<_>>(),
            )?;
            d.set_item("depth", s.depth)?;
            d.set_item(
                "slow",
                if s.slow == ferry::SlowSubscriber::Block {
                    "block"
                } else {
                    "drop"
                },
            )?;
            // Where it lives: `origin`, the far end(s) a bridge recorded, the carrying
            // bridge (see ferry::Origin).
            let (origin, far, bridge) = match s.origin {
                ferry::Origin::Local => ("local", None, None),
                ferry::Origin::Bridged { far } => ("bridged", Some(far), None),
                ferry::Origin::Carried { by, to } => ("carried", Some(to), Some(member(by))),
                ferry::Origin::Damaged => ("damaged", None, None),
            };
            d.set_item("origin", origin)?;
            d.set_item("far", far)?;
            d.set_item("bridge", bridge)?;
            Ok(d)
        })
        .collect()
}
