//! URL pieces: every byte but RFC 3986's unreserved ones (`A-Z a-z 0-9 - _ . ~`) percent-encoded,
//! so a value never ends a query early or reaches another route.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

/// What [`component`] encodes: everything but the unreserved characters.
pub const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');

/// What [`path`] encodes: the same, but `/` passes.
const PATH: &AsciiSet = &UNRESERVED.remove(b'/');

/// A query value (or key) percent-encoded.
pub fn component(s: &str) -> String {
    utf8_percent_encode(s, UNRESERVED).to_string()
}

/// One path segment: [`component`], and `.` or `..` (which a client or proxy would resolve) spelled
/// `%2E`, so an id never reaches another route.
pub fn segment(s: &str) -> String {
    let out = component(s);
    if out == "." || out == ".." {
        out.replace('.', "%2E")
    } else {
        out
    }
}

/// A path whose `/` separate segments (a storage path in a query value).
pub fn path(s: &str) -> String {
    utf8_percent_encode(s, PATH).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unreserved_bytes_pass() {
        assert_eq!(component("a-Z_0.9~"), "a-Z_0.9~");
        assert_eq!(component("a b&c=d/e?f#g%"), "a%20b%26c%3Dd%2Fe%3Ff%23g%25");
        assert_eq!(component("é"), "%C3%A9");
        assert_eq!(segment("a-000001[3]"), "a-000001%5B3%5D");
        assert_eq!(segment(".."), "%2E%2E");
        assert_eq!(segment("."), "%2E");
        assert_eq!(segment("../x"), "..%2Fx");
        assert_eq!(path("/vast/p q/x"), "/vast/p%20q/x");
    }
}
