//! Keys as bytes without loss. A JavaScript string is any sequence of UTF-16
//! code units, lone surrogates included; UTF-8 has no bytes for those, and a
//! lossy conversion (U+FFFD) would let distinct keys share a Redis counter.
//! WTF-8 encodes every sequence of units to its own bytes, and is UTF-8 for
//! every well-formed string, so the Redis data layout is unchanged for them.

/// Appends the WTF-8 encoding of `units` to `out`.
pub fn extend(out: &mut Vec<u8>, units: &[u16]) {
    out.reserve(units.len());
    let mut i = 0;
    while i < units.len() {
        let unit = units[i];
        i += 1;
        let code = match unit {
            0x00..=0x7f => {
                out.push(unit as u8);
                continue;
            }
            0xd800..=0xdbff => match units.get(i) {
                Some(&low @ 0xdc00..=0xdfff) => {
                    i += 1;
                    0x10000 + ((u32::from(unit) - 0xd800) << 10) + (u32::from(low) - 0xdc00)
                }
                // A lone high surrogate: encoded as if it were a code point.
                _ => u32::from(unit),
            },
            _ => u32::from(unit),
        };
        push_code(out, code);
    }
}

fn push_code(out: &mut Vec<u8>, code: u32) {
    match code {
        0..=0x7ff => out.extend_from_slice(&[0xc0 | (code >> 6) as u8, 0x80 | (code & 0x3f) as u8]),
        0x800..=0xffff => out.extend_from_slice(&[
            0xe0 | (code >> 12) as u8,
            0x80 | ((code >> 6) & 0x3f) as u8,
            0x80 | (code & 0x3f) as u8,
        ]),
        _ => out.extend_from_slice(&[
            0xf0 | (code >> 18) as u8,
            0x80 | ((code >> 12) & 0x3f) as u8,
            0x80 | ((code >> 6) & 0x3f) as u8,
            0x80 | (code & 0x3f) as u8,
        ]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn wtf8(units: &[u16]) -> Vec<u8> {
        let mut out = Vec::new();
        extend(&mut out, units);
        out
    }

    #[test]
    fn well_formed_strings_are_utf8() {
        for s in ["", "user:1", "é", "日本", "🦀 key", "\0"] {
            let units: Vec<u16> = s.encode_utf16().collect();
            assert_eq!(wtf8(&units), s.as_bytes());
        }
    }

    #[test]
    fn lone_surrogates_keep_their_own_bytes() {
        let user = |last: u16| {
            let mut units: Vec<u16> = "user:".encode_utf16().collect();
            units.push(last);
            wtf8(&units)
        };
        let (high, top, low) = (user(0xd800), user(0xdbff), user(0xdc00));
        let replacement = user(0xfffd);
        assert_eq!(high, b"user:\xed\xa0\x80");
        assert_eq!(top, b"user:\xed\xaf\xbf");
        assert_eq!(low, b"user:\xed\xb0\x80");
        for other in [&top, &low, &replacement] {
            assert_ne!(&high, other);
        }
        // A pair written in two halves is still the pair's character.
        assert_eq!(wtf8(&[0xd83e, 0xdd80]), "🦀".as_bytes());
        // A low surrogate before a high one is two lone surrogates.
        assert_eq!(wtf8(&[0xdc00, 0xd800]), b"\xed\xb0\x80\xed\xa0\x80");
    }

    proptest! {
        /// Distinct sequences of units never share bytes.
        #[test]
        fn the_encoding_is_one_to_one(
            a in prop::collection::vec(prop::sample::select(vec![0x41u16, 0xe9, 0xd800, 0xdbff, 0xdc00, 0xdfff, 0xfffd, 0xd83e, 0xdd80]), 0..8),
            b in prop::collection::vec(prop::sample::select(vec![0x41u16, 0xe9, 0xd800, 0xdbff, 0xdc00, 0xdfff, 0xfffd, 0xd83e, 0xdd80]), 0..8),
        ) {
            prop_assert_eq!(a == b, wtf8(&a) == wtf8(&b));
        }
    }
}
