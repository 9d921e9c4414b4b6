//! The return pipe of a ping-pong run: one byte per message, receiver to
//! source. Every transport uses the same plain pipe for it, so its cost is the
//! same in every series (and falls in the intercept of a per-page fit).

use std::fs::File;
use std::io;

use super::stream::{open_fd, read_exact, write_all};
use crate::protocol::Wait;

/// A worker's end of the return pipe.
pub struct Ack {
    file: File,
}

impl Ack {
    pub fn open(spec: &str, wait: Wait) -> io::Result<Ack> {
        Ok(Ack {
            file: open_fd(spec, wait)?,
        })
    }

    /// Tells the source that a message has been received and touched.
    pub fn signal(&mut self) -> io::Result<()> {
        write_all(&mut self.file, &[1])
    }

    /// Waits for the receiver's signal.
    pub fn wait(&mut self) -> io::Result<()> {
        read_exact(&mut self.file, &mut [0])
    }
}
