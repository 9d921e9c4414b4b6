//! Input into application buffers: alignment and copyout.
//!
//! Application-allocated input fills a buffer the application names. On this machine
//! copying out of the sender's read-only lot mapping is the cheapest input at every size
//! up to a few MiB (GENIE.md: 5.1–5.4 µs for 64 KiB through `pread`, a hot `memcpy`
//! faster still), and swapping whole pages in (`mmap(MAP_FIXED)` of the lot over the
//! application's buffer) never beat a hot copy up to 1 MiB and only tied it at 16 MiB,
//! while `MAP_PRIVATE` is no snapshot. So input copies. Page swapping is not built: the
//! default [`Thresholds::swap`](super::Thresholds) is "never" (`usize::MAX`), and if a
//! calibration file ever sets it lower, the input still copies and counts
//! [`Fallback::NoSwap`](super::Fallback) so the benchmark shows it.
//!
//! Alignment: ferry places output data at the same offset within a page as it had in
//! the sender's buffer (copy output allocates the fbuf one partial page larger to do so),
//! and [`Passing::input_alignment`](super::Passing::input_alignment) tells receivers so:
//! a destination whose page offset matches lines whole pages up, which is what page
//! swapping would need and what keeps the copy's source and destination equally aligned.

use crate::error::{Error, Result};
use crate::iodata::IoData;

/// What a receiver should do so that input lines up with the data's pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InputAlignment {
    /// Alignment the destination should have (the page size).
    pub align: usize,
    /// Data arrives at the same offset within a page as it had in the sender's buffer;
    /// for buffers made by [`Passing::app_buffer`](super::Passing::app_buffer) and
    /// [`Passing::sys_buffer`](super::Passing::sys_buffer), offset 0 of the buffer.
    pub preserves_page_offset: bool,
    /// Messages need no more room than their length.
    pub max_len: Option<usize>,
}

/// Copies `data` into the start of `dst`; fails, without copying, if it does not fit.
pub(crate) fn copy_into(data: &IoData, dst: &mut [u8]) -> Result<usize> {
    let n = data.len();
    if n > dst.len() {
        return Err(Error::InvalidArgument(
            "destination is shorter than the message",
        ));
    }
    data.copy_range_to_slice(.., &mut dst[..n]);
    Ok(n)
}
