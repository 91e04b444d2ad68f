//! Structure-aware mutation for fuzzing the parsers of outside input (traces, configs, request
//! bodies): seeded, so a case is reproduced by its seed; line and token level, with boundary values.
//! `rm-replay fuzz` and the runtime's fuzz tests use it.

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::Rng;

/// Values that break parsers: signs, overflow, non-numbers, empties, odd Unicode, nesting.
const INTERESTING: [&str; 24] = [
    "-1",
    "0",
    "-0",
    "1e308",
    "-1e308",
    "1e-320",
    "NaN",
    "inf",
    "18446744073709551616",
    "9223372036854775807",
    "4294967296",
    "",
    " ",
    "\"\"",
    "null",
    "[]",
    "{}",
    "[[[[[[[[]]]]]]]]",
    "99999999999999d",
    "1-00:00:00",
    "é\u{200b}\u{fffd}",
    "\t",
    ":",
    "%",
];

pub fn below(rng: &mut ChaCha8Rng, n: usize) -> usize {
    if n == 0 {
        0
    } else {
        (rng.next_u64() % n as u64) as usize
    }
}

/// One structure-aware mutation of `text`: at most ~200 lines of it, then 1-4 edits (replace a token
/// with an interesting value, delete / duplicate / swap / truncate a line, insert random characters).
pub fn mutate(text: &str, rng: &mut ChaCha8Rng) -> String {
    let all: Vec<&str> = text.lines().collect();
    let start = below(rng, all.len().saturating_sub(200) + 1);
    let mut lines: Vec<String> = all[start..(start + 200).min(all.len())]
        .iter()
        .map(|s| s.to_string())
        .collect();
    // Keep a header line for formats that need it (sacct, alibaba, SWF comments).
    if start > 0
        && let Some(h) = all.first()
    {
        lines.insert(0, h.to_string());
    }
    for _ in 0..1 + below(rng, 4) {
        if lines.is_empty() {
            lines.push(String::new());
        }
        let i = below(rng, lines.len());
        match below(rng, 7) {
            0 | 1 => {
                // Replace one token (split at delimiters, kept) with an interesting value.
                let line = &lines[i];
                let bounds: Vec<usize> = std::iter::once(0)
                    .chain(
                        line.char_indices()
                            .filter(|(_, c)| " ,|:\"{}[]\t=".contains(*c))
                            .map(|(j, _)| j),
                    )
                    .chain(std::iter::once(line.len()))
                    .collect();
                let k = below(rng, bounds.len().saturating_sub(1).max(1));
                let (a, b) = (bounds[k].min(line.len()), bounds[(k + 1).min(bounds.len() - 1)]);
                let a = if a < b && a > 0 {
                    a + line[a..].chars().next().map_or(0, char::len_utf8)
                } else {
                    a
                };
                let v = INTERESTING[below(rng, INTERESTING.len())];
                lines[i] = format!("{}{}{}", &line[..a.min(b)], v, &line[b.max(a.min(b))..]);
            }
            2 => {
                lines.remove(i);
            }
            3 => {
                let l = lines[i].clone();
                lines.insert(i, l);
            }
            4 => {
                let j = below(rng, lines.len());
                lines.swap(i, j);
            }
            5 => {
                let l = &lines[i];
                let cut = below(rng, l.len() + 1);
                let cut = (0..=cut).rev().find(|c| l.is_char_boundary(*c)).unwrap_or(0);
                lines[i] = l[..cut].to_string();
            }
            _ => {
                let l = &lines[i];
                let at = below(rng, l.len() + 1);
                let at = (0..=at).rev().find(|c| l.is_char_boundary(*c)).unwrap_or(0);
                let junk: String = (0..1 + below(rng, 6))
                    .map(|_| char::from_u32(32 + (rng.next_u32() % 95)).unwrap_or('?'))
                    .collect();
                lines[i] = format!("{}{junk}{}", &l[..at], &l[at..]);
            }
        }
    }
    lines.join("\n")
}

/// One byte-level mutation of an encoded message (protobuf, say): 1-3 edits — flip a bit, write a
/// boundary byte (0x00, 0x7f, 0x80, 0xff), delete a byte, duplicate up to 8 bytes in place, or
/// truncate.
pub fn mutate_bytes(valid: &[u8], rng: &mut ChaCha8Rng) -> Vec<u8> {
    let mut b = valid.to_vec();
    for _ in 0..=below(rng, 3) {
        if b.is_empty() {
            break;
        }
        let at = below(rng, b.len());
        match below(rng, 5) {
            0 => {
                let bit = below(rng, 8);
                b[at] ^= 1 << bit;
            }
            1 => b[at] = [0x00, 0x7f, 0x80, 0xff][below(rng, 4)],
            2 => {
                b.remove(at);
            }
            3 => {
                let chunk: Vec<u8> = b[at..].iter().take(8).copied().collect();
                b.splice(at..at, chunk);
            }
            _ => b.truncate(at),
        }
    }
    b
}
