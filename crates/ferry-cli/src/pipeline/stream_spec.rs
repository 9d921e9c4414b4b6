//! Where a pipeline reads from and writes to: a file, stdin/stdout, or a TCP connection.

use std::fs::File;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;

use anyhow::{Context, Result};

/// An input or output as named on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamSpec {
    /// `-`: stdin for the input, stdout for the output.
    Std,
    /// `tcp:HOST:PORT`: connect.
    Tcp(String),
    /// `tcp-listen:PORT`: accept one connection on all interfaces.
    TcpListen(u16),
    /// Anything else: a file path.
    File(String),
}

impl StreamSpec {
    /// Parses the command-line form.
    pub fn parse(s: &str) -> Result<Self, String> {
        if s == "-" {
            Ok(Self::Std)
        } else if let Some(addr) = s.strip_prefix("tcp:") {
            Ok(Self::Tcp(addr.to_string()))
        } else if let Some(port) = s.strip_prefix("tcp-listen:") {
            port.parse()
                .map(Self::TcpListen)
                .map_err(|e| format!("bad port in {s:?}: {e}"))
        } else if s.is_empty() {
            Err("empty path".into())
        } else {
            Ok(Self::File(s.to_string()))
        }
    }

    /// Opens the stream for reading. Returns the descriptor and, for a regular file, the
    /// number of bytes left to read (for the progress bar).
    pub fn open_input(&self) -> Result<(File, Option<u64>)> {
        let f = match self {
            Self::Std => File::from(dup(std::io::stdin().as_fd())?),
            Self::File(p) => File::open(p).with_context(|| format!("open input {p}"))?,
            Self::Tcp(a) => File::from(OwnedFd::from(
                TcpStream::connect(a).with_context(|| format!("connect to {a}"))?,
            )),
            Self::TcpListen(port) => File::from(OwnedFd::from(accept(*port)?)),
        };
        let meta = f.metadata().context("fstat input")?;
        let ft = meta.file_type();
        if !(ft.is_file() || ft.is_fifo() || ft.is_socket()) {
            anyhow::bail!("the input must be a regular file, a pipe or a socket");
        }
        let left = if ft.is_file() {
            use std::io::Seek;
            let pos = (&f).stream_position().unwrap_or(0);
            Some(meta.len().saturating_sub(pos))
        } else {
            None
        };
        Ok((f, left))
    }

    /// Opens the stream for writing (a file is created or truncated). Returns the
    /// descriptor and whether pallets can go out to it unmapped (a file, pipe or socket);
    /// anything else (a terminal, `/dev/null`) gets `write(2)` from a read-only mapping.
    pub fn open_output(&self) -> Result<(File, bool)> {
        let f = match self {
            Self::Std => File::from(dup(std::io::stdout().as_fd())?),
            Self::File(p) => File::create(p).with_context(|| format!("create output {p}"))?,
            Self::Tcp(a) => File::from(OwnedFd::from(
                TcpStream::connect(a).with_context(|| format!("connect to {a}"))?,
            )),
            Self::TcpListen(port) => File::from(OwnedFd::from(accept(*port)?)),
        };
        let ft = f.metadata().context("fstat output")?.file_type();
        Ok((f, ft.is_file() || ft.is_fifo() || ft.is_socket()))
    }
}

fn dup(fd: std::os::fd::BorrowedFd<'_>) -> Result<OwnedFd> {
    fd.try_clone_to_owned().context("dup a standard stream")
}

fn accept(port: u16) -> Result<TcpStream> {
    let l =
        TcpListener::bind(("0.0.0.0", port)).with_context(|| format!("listen on port {port}"))?;
    let (s, _) = l
        .accept()
        .with_context(|| format!("accept on port {port}"))?;
    Ok(s)
}
