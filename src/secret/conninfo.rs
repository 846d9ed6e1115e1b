//! Hiding the password of a PostgreSQL connection string, in every form tokio-postgres accepts:
//! the URL's user info (`postgres://user:PASSWORD@host/db`), a `password=` query parameter, and
//! the `key=value` form (`host=db password=PASSWORD`, or `password='with spaces'`).
//!
//! Invariant: redaction errs towards hiding. The scanners follow tokio-postgres' own parser, and
//! wherever the text does not parse the way that parser would read it, the rest of the string is
//! hidden; in a URL, both the driver's reading of the user info (up to the first `@`) and libpq's
//! (up to the last `@` before the path) are hidden.

use super::{has_sensitive_word, MASK};

/// `url` with its password, and any other parameter whose name looks sensitive, replaced by
/// `***`. Text that is neither a URL nor `key=value` pairs is hidden from where it stops parsing.
pub fn redact_database_url(url: &str) -> String {
    match url.find("://") {
        Some(i) => redact_url(url, i + 3),
        None => redact_key_value(url),
    }
}

/// The URL form: user info and query parameters.
fn redact_url(url: &str, authority_start: usize) -> String {
    let rest = &url[authority_start..];
    let mut hidden: Vec<(usize, usize)> = Vec::new();
    // The driver reads the user info up to the first `@` of the whole rest; libpq up to the last
    // `@` before the path or query. Hide the password through whichever reaches further.
    if let Some(first_at) = rest.find('@') {
        if let Some(colon) = rest[..first_at].find(':') {
            let authority_end = rest[first_at..]
                .find(['/', '?'])
                .map_or(rest.len(), |i| first_at + i);
            let last_at = rest[..authority_end].rfind('@').unwrap_or(first_at);
            hidden.push((colon + 1, last_at));
        }
    }
    // Query parameters: after any `?` or `&`, `key=value` up to the next `&`.
    for (sep, _) in rest.match_indices(['?', '&']) {
        let param = &rest[sep + 1..];
        let end = param.find('&').unwrap_or(param.len());
        if let Some(eq) = param[..end].find('=') {
            if has_sensitive_word(&percent_decode(&param[..eq])) {
                hidden.push((sep + 1 + eq + 1, sep + 1 + end));
            }
        }
    }
    let mut out = String::from(&url[..authority_start]);
    out.push_str(&hide_ranges(rest, hidden));
    out
}

/// `text` with each of the byte ranges (which may overlap) replaced by one `***`.
fn hide_ranges(text: &str, mut ranges: Vec<(usize, usize)>) -> String {
    ranges.sort_unstable();
    let mut out = String::new();
    let mut at = 0;
    for (start, end) in ranges {
        if start < at {
            at = at.max(end); // overlaps the range hidden last: hide up to the further end
            continue;
        }
        out.push_str(&text[at..start]);
        out.push_str(MASK);
        at = end;
    }
    out.push_str(&text[at..]);
    out
}

/// Percent-decodes a query key (lossy); a malformed escape is kept as it is. The driver's own
/// decoding (`percent_encoding`, which tokio-postgres calls on every query key and value), so that
/// a key is read here as the driver reads it.
fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// The `key=value` form, scanned the way tokio-postgres parses it: whitespace between pairs and
/// around `=`, values either bare (up to whitespace) or single-quoted, `\` escaping the next
/// character in both.
fn redact_key_value(s: &str) -> String {
    let mut out = String::new();
    let mut at = 0;
    loop {
        at = copy_while(s, at, &mut out, char::is_whitespace);
        if at == s.len() {
            return out;
        }
        let key_start = at;
        at = copy_while(s, at, &mut out, |c| !c.is_whitespace() && c != '=');
        let key = &s[key_start..at];
        at = copy_while(s, at, &mut out, char::is_whitespace);
        if key.is_empty() || !s[at..].starts_with('=') {
            return hide_rest(out, s, at);
        }
        out.push('=');
        at = copy_while(s, at + 1, &mut out, char::is_whitespace);
        let Some(end) = value_end(s, at) else {
            return hide_rest(out, s, at);
        };
        if has_sensitive_word(key) {
            out.push_str(MASK);
        } else {
            out.push_str(&s[at..end]);
        }
        at = end;
    }
}

/// Copies the characters of `s` from byte `at` while `keep` holds; returns where it stopped.
fn copy_while(s: &str, at: usize, out: &mut String, keep: impl Fn(char) -> bool) -> usize {
    let len = s[at..].find(|c: char| !keep(c)).unwrap_or(s.len() - at);
    out.push_str(&s[at..at + len]);
    at + len
}

/// The end of the value starting at byte `at`, or `None` when it does not parse (empty, or an
/// unterminated quote).
fn value_end(s: &str, at: usize) -> Option<usize> {
    let quoted = s[at..].starts_with('\'');
    let mut chars = s[at..].char_indices().skip(usize::from(quoted));
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => {
                chars.next();
            }
            '\'' if quoted => return Some(at + i + 1),
            c if c.is_whitespace() && !quoted => return (i > 0).then_some(at + i),
            _ => {}
        }
    }
    (!quoted && at < s.len()).then_some(s.len())
}

fn hide_rest(mut out: String, s: &str, at: usize) -> String {
    if at < s.len() {
        out.push_str(MASK);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::redact_database_url as redact;

    const PW: &str = "Sup3rS3cretPw";

    #[test]
    fn the_password_of_a_url_is_hidden_in_every_form() {
        for (url, shown) in [
            (
                "postgres://app:s3cr%40t@db:5432/x?sslmode=require",
                "postgres://app:***@db:5432/x?sslmode=require",
            ),
            ("postgres://app@db/x", "postgres://app@db/x"),
            ("postgresql://db/x", "postgresql://db/x"),
            (
                "postgres://app:Sup3rS3cretPw@db/x",
                "postgres://app:***@db/x",
            ),
            // An unencoded `@`, `/` or `?` in the password.
            (
                "postgres://app:Sup3r@S3cretPw@db/x",
                "postgres://app:***@db/x",
            ),
            (
                "postgres://app:Sup3r/S3cretPw@db/x",
                "postgres://app:***@db/x",
            ),
            (
                "postgres://app:Sup3r?S3cretPw@db/x",
                "postgres://app:***@db/x",
            ),
            (
                "postgres://app@db/x?password=Sup3rS3cretPw&sslmode=require",
                "postgres://app@db/x?password=***&sslmode=require",
            ),
            (
                "postgres://db/x?sslmode=disable&password=Sup3rS3cretPw",
                "postgres://db/x?sslmode=disable&password=***",
            ),
            (
                "postgres://db/x?pass%77ord=Sup3rS3cretPw",
                "postgres://db/x?pass%77ord=***",
            ),
            (
                "postgres://db/x?password=a@Sup3rS3cretPw",
                "postgres://db/x?password=***",
            ),
        ] {
            assert_eq!(redact(url), shown, "{url}");
            assert!(!redact(url).contains("S3cret"), "{url}");
        }
    }

    #[test]
    fn query_keys_are_percent_decoded_and_a_malformed_escape_kept() {
        use super::percent_decode;
        for (key, decoded) in [
            ("password", "password"),
            ("pass%77ord", "password"),
            ("%2F", "/"),
            ("%2f", "/"),
            ("%41%42", "AB"),
            ("%%41", "%A"),
            ("%C3%A9", "é"),
            ("%00", "\0"),
            // Invalid UTF-8 after decoding: replaced, not refused.
            ("%FF", "\u{FFFD}"),
            ("%C3", "\u{FFFD}"),
            // Malformed escapes stay as they are.
            ("%", "%"),
            ("%4", "%4"),
            ("a%", "a%"),
            ("%zz", "%zz"),
            ("%4g", "%4g"),
            ("%-7", "%-7"),
            ("%é", "%é"),
            ("%4é", "%4é"),
            ("", ""),
        ] {
            assert_eq!(percent_decode(key), decoded, "{key}");
        }
        // A `+` where the first hex digit belongs is no escape, as the driver reads it.
        assert_eq!(percent_decode("%+7"), "%+7");
    }

    #[test]
    fn the_password_of_a_key_value_string_is_hidden() {
        for (conn, shown) in [
            (
                "host=db user=app password=Sup3rS3cretPw dbname=x",
                "host=db user=app password=*** dbname=x",
            ),
            (
                "host=db password = 'Sup3r S3cret Pw' dbname=x",
                "host=db password = *** dbname=x",
            ),
            (
                r"password='it\'s Sup3rS3cretPw' host=db",
                "password=*** host=db",
            ),
            (r"password=Sup3r\ S3cretPw host=db", "password=*** host=db"),
            ("  host=db\tport=5432  ", "  host=db\tport=5432  "),
            ("host=db", "host=db"),
            ("", ""),
            // tokio-postgres reads `host=db` as the password here.
            ("password= host=db", "password= ***"),
            // Not parseable: the rest is hidden.
            ("host=db password='Sup3r S3cretPw", "host=db password=***"),
            ("host=db password Sup3rS3cretPw", "host=db password ***"),
            ("host=db =Sup3rS3cretPw", "host=db ***"),
        ] {
            assert_eq!(redact(conn), shown, "{conn}");
        }
        let quoted = format!("password='{PW} with spaces'");
        assert_eq!(redact(&quoted), "password=***");
    }

    #[test]
    fn what_is_shown_parses_like_the_original() {
        for conn in [
            "host=db user=app password=Sup3rS3cretPw dbname=x",
            "postgres://app:Sup3rS3cretPw@db:5433/x?sslmode=disable",
        ] {
            let original: tokio_postgres::Config = conn.parse().unwrap();
            let shown: tokio_postgres::Config = redact(conn).parse().unwrap();
            assert_eq!(original.get_hosts(), shown.get_hosts());
            assert_eq!(original.get_dbname(), shown.get_dbname());
            assert_eq!(original.get_user(), shown.get_user());
            assert_eq!(shown.get_password(), Some(b"***".as_slice()));
        }
    }
}
