//! Input into application buffers: alignment, copyout and page swapping.
//!
//! Application-allocated input fills a buffer the application names. Copying out of the
//! sender's read-only lot mapping measured the cheapest input at every size up to a few
//! MiB (docs/semantics.md: 5.1–5.4 µs for 64 KiB through `pread`, a hot `memcpy`
//! faster still), and swapping whole pages in (`mmap(MAP_FIXED)` of the sender's lot over
//! the application's buffer: 6.2–7.1 µs at 4 KiB, 126–154 µs at 1 MiB) never beat a hot
//! copy up to 1 MiB and only tied it at 16 MiB. So input copies unless
//! [`Thresholds::swap`](super::Thresholds) says otherwise; its default is "never"
//! (`usize::MAX`), and `ferry calibrate` lowers it only where swapping measured faster.
//!
//! At or above the swap threshold, input into an [`AppBuffer`](super::AppBuffer)
//! ([`Passing::input_into_app`](super::Passing::input_into_app)) maps each whole page of
//! the data that lines up with a whole page of the buffer privately
//! (`mmap(MAP_PRIVATE | MAP_FIXED)` of the sender's lot, through the read-only descriptor)
//! over the buffer's page, and copies the partial pages at either end and anything that
//! does not line up. `MAP_PRIVATE` is no snapshot by itself: until the receiver writes a
//! page it shows the file's page, so the buffer keeps the message (and so the sender's
//! pages, unchanged under strong integrity) held for as long as it maps them; a write
//! makes a private copy (kernel copy-on-write). Before such a page is output it is copied
//! into this domain's own lot (counted in `pages_settled`). Pages under an output of the
//! buffer are never swapped over.
//!
//! Alignment: ferry places output data at the same offset within a page as it had in
//! the sender's buffer (copy output allocates the fbuf one partial page larger to do so).
//! [`Passing::preferred_offset`](super::Passing::preferred_offset) tells a receiver that
//! offset for a message, and [`Passing::input_alignment`](super::Passing::input_alignment)
//! the rule: a destination at that offset of a page lines whole pages up.

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
    /// Messages at least this long have their lined-up whole pages swapped in rather
    /// than copied (the swap threshold; `usize::MAX`: never).
    pub swap_at: usize,
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
