//! The little of DER that the certificate checks read: one item by its tag.
//!
//! Shared by the validity check (`tls`) and the pinned-certificate check
//! (`pinned`), below both, so that neither imports the other's parser.

/// `INTEGER`.
pub(super) const TAG_INTEGER: u8 = 0x02;
/// `SEQUENCE`.
pub(super) const TAG_SEQUENCE: u8 = 0x30;
/// The explicit `[0]` version of a certificate.
pub(super) const TAG_VERSION: u8 = 0xa0;

/// The DER item with `tag` at the start of `input`: its contents and what
/// follows it. `None` for another tag or a length that runs past the end.
pub(super) fn der_item(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&found, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    if found != tag {
        return None;
    }
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let (digits, rest) = rest.split_at(count);
        let len = digits
            .iter()
            .fold(0usize, |len, &b| len << 8 | usize::from(b));
        (len, rest)
    };
    (rest.len() >= len).then(|| rest.split_at(len))
}
