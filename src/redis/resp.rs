//! RESP2, the Redis protocol, for the connection engine: commands encoded
//! as arrays of bulk strings, and replies read from a byte stream as they
//! arrive (a reply may be split across reads, or many may share one).

/// One RESP value: a reply from the server, or an item of one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Status(String),
    /// An error reply: its code (the first word) and the rest.
    Error(String, String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Value>>),
}

/// Appends a command to `out`.
pub fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
    encode_parts(out, args, &[]);
}

/// Appends a command made of `head` then `tail` to `out`.
pub fn encode_parts(out: &mut Vec<u8>, head: &[&[u8]], tail: &[&[u8]]) {
    out.push(b'*');
    push_number(out, (head.len() + tail.len()) as i64);
    for arg in head.iter().chain(tail) {
        out.push(b'$');
        push_number(out, arg.len() as i64);
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

fn push_number(out: &mut Vec<u8>, n: i64) {
    out.extend_from_slice(digits(n, &mut [0; 20]));
    out.extend_from_slice(b"\r\n");
}

/// `n` in decimal, written into `buf` (no allocation per hit).
pub fn digits(n: i64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    let mut rest = n.unsigned_abs();
    loop {
        at -= 1;
        buf[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if n < 0 {
        at -= 1;
        buf[at] = b'-';
    }
    &buf[at..]
}

/// A reply that can't be RESP: the connection is out of step and must end.
#[derive(Debug, PartialEq, Eq)]
pub struct Malformed;

/// Replies from a stream of bytes.
#[derive(Default)]
pub struct Parser {
    buffer: Vec<u8>,
    /// Where the next reply starts in `buffer`.
    at: usize,
}

/// Replies nested deeper than this are refused (no reply of ours nests).
const MAX_DEPTH: usize = 8;
/// A bulk string or array longer than this is refused.
const MAX_LEN: i64 = 512 * 1024 * 1024;

impl Parser {
    /// Adds bytes read from the socket.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.at > 0 && self.at == self.buffer.len() {
            self.buffer.clear();
            self.at = 0;
        }
        self.buffer.extend_from_slice(bytes);
    }

    /// The next whole reply, if it has arrived.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<Value>, Malformed> {
        let mut at = self.at;
        match parse(&self.buffer, &mut at, 0)? {
            Some(reply) => {
                self.at = at;
                if self.at > 64 * 1024 && self.at * 2 > self.buffer.len() {
                    self.buffer.drain(..self.at);
                    self.at = 0;
                }
                Ok(Some(reply))
            }
            None => Ok(None),
        }
    }
}

/// The line at `at` (without CRLF), moving `at` past it; None if incomplete.
fn line<'a>(buffer: &'a [u8], at: &mut usize) -> Option<&'a [u8]> {
    let rest = &buffer[*at..];
    let mut from = 0;
    loop {
        let end = from + rest[from..].iter().position(|&b| b == b'\r')?;
        if *rest.get(end + 1)? == b'\n' {
            *at += end + 2;
            return Some(&rest[..end]);
        }
        from = end + 1;
    }
}

/// A RESP integer: an optional `-` and decimal digits, within i64 (no
/// text conversion per reply: a hit's answer holds three of them).
fn number(text: &[u8]) -> Result<i64, Malformed> {
    let (negative, digits) = match text {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, text),
    };
    if digits.is_empty() {
        return Err(Malformed);
    }
    // Summed as a negative number, so that i64::MIN fits.
    let mut n: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return Err(Malformed);
        }
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_sub(i64::from(d - b'0')))
            .ok_or(Malformed)?;
    }
    if negative {
        Ok(n)
    } else {
        n.checked_neg().ok_or(Malformed)
    }
}

fn parse(buffer: &[u8], at: &mut usize, depth: usize) -> Result<Option<Value>, Malformed> {
    if depth > MAX_DEPTH {
        return Err(Malformed);
    }
    let Some(&kind) = buffer.get(*at) else {
        return Ok(None);
    };
    let mut cursor = *at + 1;
    let Some(text) = line(buffer, &mut cursor) else {
        return Ok(None);
    };
    let reply = match kind {
        b'+' => Value::Status(String::from_utf8_lossy(text).into_owned()),
        b'-' => {
            let text = String::from_utf8_lossy(text);
            let (code, detail) = text.split_once(' ').unwrap_or((&text, ""));
            Value::Error(code.to_string(), detail.to_string())
        }
        b':' => Value::Int(number(text)?),
        b'$' => {
            let len = number(text)?;
            if len < 0 {
                Value::Bulk(None)
            } else if len > MAX_LEN {
                return Err(Malformed);
            } else {
                let end = cursor + len as usize;
                if buffer.len() < end + 2 {
                    return Ok(None);
                }
                if &buffer[end..end + 2] != b"\r\n" {
                    return Err(Malformed);
                }
                let bytes = buffer[cursor..end].to_vec();
                cursor = end + 2;
                Value::Bulk(Some(bytes))
            }
        }
        b'*' => {
            let len = number(text)?;
            if len < 0 {
                Value::Array(None)
            } else if len > MAX_LEN {
                return Err(Malformed);
            } else {
                let mut items = Vec::with_capacity(len.min(16) as usize);
                for _ in 0..len {
                    match parse(buffer, &mut cursor, depth + 1)? {
                        Some(item) => items.push(item),
                        None => return Ok(None),
                    }
                }
                Value::Array(Some(items))
            }
        }
        _ => return Err(Malformed),
    };
    *at = cursor;
    Ok(Some(reply))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_are_read_within_i64_and_anything_else_is_malformed() {
        for n in [0, 7, -7, 60_000, i64::MAX, i64::MIN] {
            assert_eq!(number(n.to_string().as_bytes()), Ok(n));
        }
        for bad in [
            "",
            "-",
            "+5",
            "1 ",
            "1.5",
            "0x10",
            "9223372036854775808",
            "--1",
        ] {
            assert_eq!(number(bad.as_bytes()), Err(Malformed), "{bad:?}");
        }
        assert_eq!(number(b"-9223372036854775809"), Err(Malformed));
    }

    #[test]
    fn a_line_ends_at_crlf_only_and_waits_for_its_end() {
        let mut at = 0;
        assert_eq!(line(b"+a\rb\r\n", &mut at), Some(b"+a\rb".as_slice()));
        assert_eq!(at, 6);
        assert_eq!(line(b"+ab\r", &mut 0), None);
        assert_eq!(line(b"+ab", &mut 0), None);
    }

    #[test]
    fn numbers_are_written_in_decimal() {
        use crate::window::MAX_SAFE;
        for n in [0, 7, -7, 60_000, MAX_SAFE, -MAX_SAFE, i64::MAX, i64::MIN] {
            assert_eq!(digits(n, &mut [0; 20]), n.to_string().as_bytes());
        }
    }

    #[test]
    fn commands_are_arrays_of_bulk_strings() {
        let mut out = Vec::new();
        encode(&mut out, &[b"EVALSHA", b"abc", b"1", b"k\r\n", b"-5"]);
        assert_eq!(
            out,
            b"*5\r\n$7\r\nEVALSHA\r\n$3\r\nabc\r\n$1\r\n1\r\n$3\r\nk\r\n\r\n$2\r\n-5\r\n"
        );
    }

    #[test]
    fn replies_split_anywhere_come_out_whole() {
        let stream = b"+OK\r\n-NOSCRIPT No matching script\r\n*2\r\n:5\r\n:-60000\r\n$3\r\na\r\n\r\n$-1\r\n*-1\r\n-ERR\r\n";
        let want = vec![
            Value::Status("OK".into()),
            Value::Error("NOSCRIPT".into(), "No matching script".into()),
            Value::Array(Some(vec![Value::Int(5), Value::Int(-60000)])),
            Value::Bulk(Some(b"a\r\n".to_vec())),
            Value::Bulk(None),
            Value::Array(None),
            Value::Error("ERR".into(), String::new()),
        ];
        for split in 0..stream.len() {
            let mut parser = Parser::default();
            let mut got = Vec::new();
            for part in [&stream[..split], &stream[split..]] {
                parser.feed(part);
                while let Some(reply) = parser.next().unwrap() {
                    got.push(reply);
                }
            }
            assert_eq!(got, want, "split at {split}");
        }
    }

    #[test]
    fn a_stream_out_of_step_is_refused() {
        for bad in [
            &b"?x\r\n"[..],
            b":12a\r\n",
            b"$2\r\nabc\r\n",
            b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n",
        ] {
            let mut parser = Parser::default();
            parser.feed(bad);
            assert_eq!(parser.next(), Err(Malformed), "{bad:?}");
        }
    }
}
