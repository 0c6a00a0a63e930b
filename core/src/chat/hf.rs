//! The functions and filters Hugging Face chat templates expect beyond
//! Jinja's: `tojson` with Python's `json.dumps` output, `strftime_now`.

use std::fmt::Write;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`:
/// transformers replaces Jinja's filter with `json.dumps` and these defaults,
/// so the text is Python's: `", "` and `": "` separators (`","` when
/// indenting), non-ASCII kept, no HTML escaping.
pub fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let ensure_ascii: bool = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let sort_keys: bool = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let indent: Option<String> = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_i64() {
            Some(n) => Some(" ".repeat(n.clamp(0, 64) as usize)),
            None => Some(v.as_str().unwrap_or_default().to_string()),
        },
    };
    let (item_sep, key_sep) = match kwargs.get::<Option<Vec<String>>>("separators")? {
        Some(s) if s.len() == 2 => (s[0].clone(), s[1].clone()),
        Some(_) => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: separators must be a pair")),
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    kwargs.assert_all_used()?;
    let opts = Dumps { ensure_ascii, sort_keys, indent, item_sep, key_sep };
    let mut out = String::new();
    opts.write(&value, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

struct Dumps {
    ensure_ascii: bool,
    sort_keys: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
}

/// Nesting deeper than this is refused (templates are untrusted input).
const MAX_DEPTH: usize = 128;

impl Dumps {
    fn write(&self, v: &Value, depth: usize, out: &mut String) -> Result<(), Error> {
        if depth > MAX_DEPTH {
            return Err(Error::new(ErrorKind::InvalidOperation, "tojson: value nested too deeply"));
        }
        match v.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => match v.as_i64() {
                Some(i) if v.is_integer() => write!(out, "{i}").unwrap_or_default(),
                _ => out.push_str(&python_float(f64::try_from(v.clone()).unwrap_or(f64::NAN))),
            },
            ValueKind::String | ValueKind::Bytes | ValueKind::Plain | ValueKind::Invalid => {
                self.string(v.as_str().map_or_else(|| v.to_string(), str::to_string).as_str(), out)
            }
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.container(out, depth, '[', ']', &items, |item, out| self.write(item, depth + 1, out))?;
            }
            ValueKind::Map => {
                let mut keys: Vec<Value> = v.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort_by_key(|k| k.to_string());
                }
                self.container(out, depth, '{', '}', &keys, |k, out| {
                    let key = k.as_str().map_or_else(|| k.to_string(), str::to_string);
                    self.string(&key, out);
                    out.push_str(&self.key_sep);
                    self.write(&v.get_item(k)?, depth + 1, out)
                })?;
            }
            _ => self.string(&v.to_string(), out),
        }
        Ok(())
    }

    fn container<T>(
        &self,
        out: &mut String,
        depth: usize,
        open: char,
        close: char,
        items: &[T],
        mut each: impl FnMut(&T, &mut String) -> Result<(), Error>,
    ) -> Result<(), Error> {
        out.push(open);
        if items.is_empty() {
            out.push(close);
            return Ok(());
        }
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                out.push_str(&self.item_sep);
            }
            if let Some(ind) = &self.indent {
                out.push('\n');
                out.push_str(&ind.repeat(depth + 1));
            }
            each(item, out)?;
        }
        if let Some(ind) = &self.indent {
            out.push('\n');
            out.push_str(&ind.repeat(depth));
        }
        out.push(close);
        Ok(())
    }

    fn string(&self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && (c as u32) > 0x7E) => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        write!(out, "\\u{unit:04x}").unwrap_or_default();
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// Python's `repr(float)`: shortest round-trip digits, `1.0` not `1`,
/// exponent form below 1e-4 and from 1e16, `NaN`/`Infinity` as `json.dumps`.
fn python_float(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    let exp_form = format!("{x:e}"); // shortest digits: "1.5e-7", "1e16"
    let (mantissa, exp) = exp_form.split_once('e').unwrap_or((&exp_form, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if x != 0.0 && !(-4..16).contains(&exp) {
        return format!("{mantissa}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    let s = format!("{x}");
    if s.contains('.') {
        s
    } else {
        format!("{s}.0")
    }
}

/// `strftime_now(format)`: the time templates see (UTC, see [`now`])
/// formatted with the common C `strftime` directives.
pub fn strftime_now(format: String) -> Result<Value, Error> {
    Ok(Value::from(strftime(&format, now())))
}

/// The clock templates see: `SOURCE_DATE_EPOCH` (the reproducible-builds
/// convention: seconds since the epoch, UTC) where it is set to a number,
/// else the system clock.
pub fn now() -> i64 {
    source_date_epoch(std::env::var("SOURCE_DATE_EPOCH").ok().as_deref()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
    })
}

/// A `SOURCE_DATE_EPOCH` value: decimal seconds, else none (the convention
/// says to ignore a malformed one).
fn source_date_epoch(value: Option<&str>) -> Option<i64> {
    let v = value?.trim();
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse().ok()
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

/// Format a Unix time (UTC).
pub fn strftime(format: &str, unix: i64) -> String {
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let yday = days - days_from_civil(y, 1, 1) + 1;
    let (hh, mm, ss) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let _ = match chars.next() {
            Some('Y') => write!(out, "{y}"),
            Some('y') => write!(out, "{:02}", y.rem_euclid(100)),
            Some('m') => write!(out, "{m:02}"),
            Some('d') => write!(out, "{d:02}"),
            Some('e') => write!(out, "{d:2}"),
            Some('H') => write!(out, "{hh:02}"),
            Some('I') => write!(out, "{:02}", if hh % 12 == 0 { 12 } else { hh % 12 }),
            Some('p') => write!(out, "{}", if hh < 12 { "AM" } else { "PM" }),
            Some('M') => write!(out, "{mm:02}"),
            Some('S') => write!(out, "{ss:02}"),
            Some('j') => write!(out, "{yday:03}"),
            Some('B') => write!(out, "{}", MONTHS[(m - 1) as usize]),
            Some('b') | Some('h') => write!(out, "{}", &MONTHS[(m - 1) as usize][..3]),
            Some('A') => write!(out, "{}", DAYS[weekday]),
            Some('a') => write!(out, "{}", &DAYS[weekday][..3]),
            Some('F') => write!(out, "{y}-{m:02}-{d:02}"),
            Some('T') => write!(out, "{hh:02}:{mm:02}:{ss:02}"),
            Some('%') => write!(out, "%"),
            Some(other) => write!(out, "%{other}"),
            None => write!(out, "%"),
        };
    }
    out
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Jinja2 prints values with Python's `str()`: `None`, `True`, `['a', 1]`.
/// Used for `{{ ... }}` output and the `string` filter.
pub fn py_str(v: &Value) -> String {
    match v.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::String | ValueKind::Plain => v.as_str().map_or_else(|| v.to_string(), str::to_string),
        _ => py_repr(v, 0),
    }
}

/// Python's `repr()` of a template value.
fn py_repr(v: &Value, depth: usize) -> String {
    if depth > MAX_DEPTH {
        return "...".into();
    }
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => "None".into(),
        ValueKind::Bool => (if v.is_true() { "True" } else { "False" }).into(),
        ValueKind::Number => match v.as_i64() {
            Some(i) if v.is_integer() => i.to_string(),
            _ => {
                let f = python_float(f64::try_from(v.clone()).unwrap_or(f64::NAN));
                match f.as_str() {
                    "NaN" => "nan".into(),
                    "Infinity" => "inf".into(),
                    "-Infinity" => "-inf".into(),
                    _ => f,
                }
            }
        },
        ValueKind::String | ValueKind::Plain => py_quote(v.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<String> =
                v.try_iter().map(|it| it.map(|x| py_repr(&x, depth + 1)).collect()).unwrap_or_default();
            format!("[{}]", items.join(", "))
        }
        ValueKind::Map => {
            let items: Vec<String> = v
                .try_iter()
                .map(|it| {
                    it.map(|k| {
                        format!(
                            "{}: {}",
                            py_repr(&k, depth + 1),
                            py_repr(&v.get_item(&k).unwrap_or_default(), depth + 1)
                        )
                    })
                    .collect()
                })
                .unwrap_or_default();
            format!("{{{}}}", items.join(", "))
        }
        _ => v.to_string(),
    }
}

/// A Python string literal as `repr()` writes it.
fn py_quote(s: &str) -> String {
    let q = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7F => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(q);
    out
}

/// The `{{ ... }}` formatter: Python's `str()` for everything but strings,
/// which print as they are (no HTML escaping).
pub fn formatter(out: &mut minijinja::Output, state: &minijinja::State, v: &Value) -> Result<(), Error> {
    match v.kind() {
        ValueKind::String | ValueKind::Undefined => minijinja::escape_formatter(out, state, v),
        _ => out.write_str(&py_str(v)).map_err(|e| Error::new(ErrorKind::WriteFailure, e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(strftime("%d %b %Y", 1_721_952_000), "26 Jul 2024");
        assert_eq!(strftime("%A %B %j %H:%M:%S %p %%", 0), "Thursday January 001 00:00:00 AM %");
        assert_eq!(strftime("%F", 951_782_400), "2000-02-29");
    }

    #[test]
    fn source_date_epoch_is_read_as_seconds() {
        assert_eq!(source_date_epoch(Some("1721995200")), Some(1_721_995_200));
        assert_eq!(source_date_epoch(Some(" 0 ")), Some(0));
        for bad in [None, Some(""), Some("-5"), Some("1e9"), Some("soon"), Some("99999999999999999999999")] {
            assert_eq!(source_date_epoch(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn floats_print_as_python() {
        assert_eq!(python_float(1.0), "1.0");
        assert_eq!(python_float(0.5), "0.5");
        assert_eq!(python_float(1e16), "1e+16");
        assert_eq!(python_float(1.5e-7), "1.5e-07");
        assert_eq!(python_float(123456.75), "123456.75");
    }
}
