//! Where a pipeline reads from and writes to: a file, stdin/stdout, or a TCP connection.

use std::fs::{File, Metadata, OpenOptions, Permissions};
use std::io::ErrorKind;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

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

    /// Opens the stream for writing. Returns the descriptor, whether pallets can go out
    /// to it unmapped (a file, pipe or socket; anything else, a terminal or `/dev/null`,
    /// gets `write(2)` from a read-only mapping), and for a regular file the
    /// [`Replacement`] that puts it in place.
    ///
    /// An output that is the same file as `input` (same device and inode, however
    /// named) is refused before anything is opened for writing. A file output is
    /// written to a new temporary file in the same directory, with the mode of the file
    /// it replaces, so that the file named is untouched until [`Replacement::commit`].
    pub fn open_output(&self, input: &File) -> Result<(File, bool, Option<Replacement>)> {
        let input_id = regular_file_id(&input.metadata().context("fstat input")?);
        let same = |m: &Metadata| input_id.is_some() && regular_file_id(m) == input_id;
        let (f, replacement) = match self {
            Self::Std => {
                let f = File::from(dup(std::io::stdout().as_fd())?);
                if same(&f.metadata().context("fstat stdout")?) {
                    bail!("the output (stdout) is the same file as the input");
                }
                (f, None)
            }
            Self::File(p) => match std::fs::metadata(p) {
                Ok(m) if same(&m) => bail!(
                    "output {p} is the same file as the input; refusing to overwrite what \
                     is being read"
                ),
                Ok(m) if m.is_dir() => bail!("output {p} is a directory"),
                // A device, FIFO or socket: write to it as it is.
                Ok(m) if !m.is_file() => (
                    OpenOptions::new()
                        .write(true)
                        .open(p)
                        .with_context(|| format!("open output {p}"))?,
                    None,
                ),
                Ok(m) => {
                    // Through any symlink, so that the link stays a link.
                    let target =
                        std::fs::canonicalize(p).with_context(|| format!("resolve output {p}"))?;
                    let (f, r) = Replacement::create(target, Some(m.mode() & 0o7777))?;
                    (f, Some(r))
                }
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    let (f, r) = Replacement::create(PathBuf::from(p), None)?;
                    (f, Some(r))
                }
                Err(e) => return Err(e).with_context(|| format!("output {p}")),
            },
            Self::Tcp(a) => (
                File::from(OwnedFd::from(
                    TcpStream::connect(a).with_context(|| format!("connect to {a}"))?,
                )),
                None,
            ),
            Self::TcpListen(port) => (File::from(OwnedFd::from(accept(*port)?)), None),
        };
        let ft = f.metadata().context("fstat output")?.file_type();
        Ok((
            f,
            ft.is_file() || ft.is_fifo() || ft.is_socket(),
            replacement,
        ))
    }
}

/// Device and inode of a regular file (`None` for anything else: a pipe or socket may
/// well be read and written at once).
fn regular_file_id(m: &Metadata) -> Option<(u64, u64)> {
    m.is_file().then(|| (m.dev(), m.ino()))
}

/// A file output written under a temporary name beside the file it will replace:
/// [`commit`](Self::commit) renames it into place after a successful run; dropped
/// without that (a failure, an error return after SIGINT or SIGTERM), it is removed,
/// so the file named on the command line is never left half written.
#[derive(Debug)]
pub struct Replacement {
    temp: PathBuf,
    target: PathBuf,
    committed: bool,
}

impl Replacement {
    /// Creates (`O_EXCL`) a temporary file beside `target`, with `mode` if given (the
    /// replaced file's), else the mode a new file gets (0666 less the umask).
    fn create(target: PathBuf, mode: Option<u32>) -> Result<(File, Replacement)> {
        let name = target
            .file_name()
            .with_context(|| format!("output {} names no file", target.display()))?
            .to_string_lossy()
            .into_owned();
        let dir = match target.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        for i in 0..100 {
            let temp = dir.join(format!(".{name}.ferry-{}-{i}.tmp", std::process::id()));
            match OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode.unwrap_or(0o666))
                .open(&temp)
            {
                Ok(f) => {
                    let r = Replacement {
                        temp,
                        target,
                        committed: false,
                    };
                    if let Some(m) = mode {
                        // Exactly the replaced file's mode, whatever the umask.
                        f.set_permissions(Permissions::from_mode(m))
                            .with_context(|| format!("chmod {}", r.temp.display()))?;
                    }
                    return Ok((f, r));
                }
                Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!("create a temporary output file in {}", dir.display())
                    })
                }
            }
        }
        bail!(
            "create a temporary output file in {}: 100 names taken",
            dir.display()
        )
    }

    /// The file the output will replace.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Renames the finished output into place.
    pub fn commit(mut self) -> Result<()> {
        std::fs::rename(&self.temp, &self.target).with_context(|| {
            format!(
                "rename {} to {}",
                self.temp.display(),
                self.target.display()
            )
        })?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for Replacement {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.temp);
        }
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
