//! File-system names made of untrusted strings (node, user, tenant and allocation names).

/// `s` as one path segment that cannot climb out of its directory: every character but
/// `A-Z a-z 0-9 - _ .` becomes `_`, and an empty or all-dots result is `_`.
pub fn segment(s: &str) -> String {
    let s: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() || s.chars().all(|c| c == '.') {
        "_".into()
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_segment_never_climbs_out() {
        assert_eq!(super::segment("node-01.x"), "node-01.x");
        assert_eq!(super::segment("../etc/passwd"), ".._etc_passwd");
        assert_eq!(super::segment(".."), "_");
        assert_eq!(super::segment(""), "_");
        assert_eq!(super::segment("a/b c"), "a_b_c");
    }
}
