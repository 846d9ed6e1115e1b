//! The SQL handler's typed input: a statement whose file declares its parameters, one line each
//! (`-- batch-inbox: $2 = value /amount`), receives the batch as parallel typed arrays, one
//! element per new message, read with `unnest($1::uuid[], $2::bigint[], …)`. PostgreSQL parses
//! no JSON: the fields are taken from the value parsed once in Rust and sent in binary. A file
//! may also ask for Kafka Connect's JSON envelope to be unwrapped (`-- batch-inbox: envelope =
//! connect`), in either form. docs/SQL-HANDLER.md is the user's guide.
//!
//! Invariants: every parameter of the statement is declared and every declaration is one of its
//! parameters, of an array type its source can fill, checked when the statement is prepared (at
//! start, and again on each new session); a message whose field is missing, null or of the wrong
//! type (when the field is not `optional`) is refused as `invalid_payload` naming the field,
//! before the statement runs, and never reaches it. A tombstone's value fields are NULL.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::value::RawValue;
use serde_json::Value;
use tokio_postgres::types::{Kind, ToSql, Type};
use uuid::Uuid;

use super::input::Jsonb;
use super::JsonPayload;
use crate::pipeline::handler::Rejection;
use crate::pipeline::message::{clean_text, Message};
use crate::reason::Reason;

/// How a declaration line begins.
pub(super) const PREFIX: &str = "-- batch-inbox:";

/// The most parameters a statement may declare.
const MAX_PARAMETERS: usize = 100;

/// Where a parameter's elements come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Source {
    MessageId,
    Topic,
    Key,
    Partition,
    Offset,
    TimestampMs,
    Tombstone,
    /// The last header of that name.
    Header(Vec<u8>),
    /// The whole value (an envelope's payload).
    Value,
    /// A JSON pointer into the value (an envelope's payload).
    Pointer(String),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::MessageId => f.write_str("message_id"),
            Source::Topic => f.write_str("topic"),
            Source::Key => f.write_str("key"),
            Source::Partition => f.write_str("partition"),
            Source::Offset => f.write_str("offset"),
            Source::TimestampMs => f.write_str("timestamp_ms"),
            Source::Tombstone => f.write_str("tombstone"),
            Source::Header(name) => write!(f, "header {}", String::from_utf8_lossy(name)),
            Source::Value => f.write_str("value"),
            Source::Pointer(p) => write!(f, "value {p}"),
        }
    }
}

/// One declared parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Field {
    source: Source,
    /// A missing or null field is NULL instead of a refusal.
    optional: bool,
}

/// What a value is wrapped in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Envelope {
    /// The value is the data.
    #[default]
    None,
    /// Kafka Connect's JSON envelope, `{"schema": …, "payload": …}`: the data is the payload.
    Connect,
}

/// A statement file's declarations: its parameters (`fields[i]` is `$i+1`; none: the `jsonb`
/// form) and its envelope.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) struct Declarations {
    pub(super) fields: Vec<Field>,
    pub(super) envelope: Envelope,
}

impl Declarations {
    /// Whether they read the value as JSON: a field of it, or an envelope.
    pub(super) fn reads_json(&self) -> bool {
        self.envelope == Envelope::Connect
            || self
                .fields
                .iter()
                .any(|f| matches!(f.source, Source::Pointer(_)))
    }
}

/// The declarations of `sql`: its lines that begin with [`PREFIX`] (after blanks).
pub(super) fn declarations(sql: &str) -> Result<Declarations, String> {
    let mut fields: Vec<Option<Field>> = Vec::new();
    let mut envelope = None;
    for (n, line) in sql.lines().enumerate() {
        let Some(rest) = line.trim_start().strip_prefix(PREFIX) else {
            continue;
        };
        let at = |e: String| format!("line {}: {e}", n + 1);
        match declaration(rest).map_err(at)? {
            Declaration::Envelope(e) => {
                if envelope.replace(e).is_some() {
                    return Err(at("the envelope is declared twice".to_owned()));
                }
            }
            Declaration::Parameter(i, field) => {
                if fields.len() <= i {
                    fields.resize(i + 1, None);
                }
                if fields[i].replace(field).is_some() {
                    return Err(at(format!("${} is declared twice", i + 1)));
                }
            }
        }
    }
    if let Some(hole) = fields.iter().position(Option::is_none) {
        return Err(format!(
            "${} is not declared, but ${} is: declare every parameter",
            hole + 1,
            fields.len()
        ));
    }
    Ok(Declarations {
        fields: fields.into_iter().flatten().collect(),
        envelope: envelope.unwrap_or_default(),
    })
}

enum Declaration {
    Envelope(Envelope),
    Parameter(usize, Field),
}

const FORMS: &str = "`$N = message_id | topic | key | partition | offset | timestamp_ms | \
                     tombstone | header NAME | value | value /POINTER`, then `optional` if it may \
                     be missing, or `envelope = connect | none`";

fn declaration(text: &str) -> Result<Declaration, String> {
    let (name, rest) = text
        .split_once('=')
        .ok_or_else(|| format!("expected {FORMS}"))?;
    let name = name.trim();
    let mut words = words(rest)?.into_iter();
    if name == "envelope" {
        let envelope = match words.next().as_deref() {
            Some("connect") => Envelope::Connect,
            Some("none") => Envelope::None,
            other => {
                return Err(format!(
                    "envelope {:?}: expected `connect` or `none`",
                    other.unwrap_or_default()
                ))
            }
        };
        return match words.next() {
            None => Ok(Declaration::Envelope(envelope)),
            Some(extra) => Err(format!("unexpected {extra:?} after the envelope")),
        };
    }
    let number = name
        .strip_prefix('$')
        .and_then(|n| n.parse::<usize>().ok())
        .filter(|n| (1..=MAX_PARAMETERS).contains(n))
        .ok_or_else(|| {
            format!("{name:?} is not a parameter ($1 to ${MAX_PARAMETERS}); expected {FORMS}")
        })?;
    let source = match words.next().as_deref() {
        Some("message_id") => Source::MessageId,
        Some("topic") => Source::Topic,
        Some("key") => Source::Key,
        Some("partition") => Source::Partition,
        Some("offset") => Source::Offset,
        Some("timestamp_ms") => Source::TimestampMs,
        Some("tombstone") => Source::Tombstone,
        Some("header") => match words.next() {
            Some(header) if !header.is_empty() => Source::Header(header.into_bytes()),
            _ => return Err("`header` needs a header name".to_owned()),
        },
        Some("value") => {
            let mut rest: Vec<String> = words.collect();
            let pointer = match rest.first() {
                Some(p) if p.starts_with('/') => Some(rest.remove(0)),
                _ => None,
            };
            words = rest.into_iter();
            match pointer {
                Some(p) => Source::Pointer(p),
                None => Source::Value,
            }
        }
        other => {
            return Err(format!(
                "{:?} is not a source; expected {FORMS}",
                other.unwrap_or_default()
            ))
        }
    };
    let optional = match words.next().as_deref() {
        None => false,
        Some("optional") => true,
        Some(other) => return Err(format!("unexpected {other:?} after `{source}`")),
    };
    if let Some(extra) = words.next() {
        return Err(format!("unexpected {extra:?} after `{source}`"));
    }
    Ok(Declaration::Parameter(
        number - 1,
        Field { source, optional },
    ))
}

/// `text` split at blanks; a word that begins with `"` is a JSON string (a header name or a
/// pointer with blanks in it).
fn words(text: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut rest = text.trim_start();
    while !rest.is_empty() {
        if rest.starts_with('"') {
            let mut escaped = false;
            let end = rest[1..].char_indices().find_map(|(i, c)| {
                let end = !escaped && c == '"';
                escaped = !escaped && c == '\\';
                end.then_some(i + 2)
            });
            let end = end.ok_or_else(|| format!("unterminated string {rest:?}"))?;
            let word: String = serde_json::from_str(&rest[..end])
                .map_err(|e| format!("{:?} is not a JSON string: {e}", &rest[..end]))?;
            out.push(word);
            rest = rest[end..].trim_start();
        } else {
            let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
            out.push(rest[..end].to_owned());
            rest = rest[end..].trim_start();
        }
    }
    Ok(out)
}

/// An array parameter's element type, of those a field can fill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Element {
    Int2,
    Int4,
    Int8,
    Float4,
    Float8,
    Text,
    Bool,
    Uuid,
    Jsonb,
    Bytea,
    Timestamptz,
}

impl Element {
    fn of(ty: &Type) -> Option<Self> {
        let Kind::Array(member) = ty.kind() else {
            return None;
        };
        Some(match *member {
            Type::INT2 => Element::Int2,
            Type::INT4 => Element::Int4,
            Type::INT8 => Element::Int8,
            Type::FLOAT4 => Element::Float4,
            Type::FLOAT8 => Element::Float8,
            Type::TEXT | Type::VARCHAR => Element::Text,
            Type::BOOL => Element::Bool,
            Type::UUID => Element::Uuid,
            Type::JSONB => Element::Jsonb,
            Type::BYTEA => Element::Bytea,
            Type::TIMESTAMPTZ => Element::Timestamptz,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Element::Int2 => "smallint[]",
            Element::Int4 => "integer[]",
            Element::Int8 => "bigint[]",
            Element::Float4 => "real[]",
            Element::Float8 => "double precision[]",
            Element::Text => "text[]",
            Element::Bool => "boolean[]",
            Element::Uuid => "uuid[]",
            Element::Jsonb => "jsonb[]",
            Element::Bytea => "bytea[]",
            Element::Timestamptz => "timestamptz[]",
        }
    }
}

impl Source {
    /// The element types this source fills.
    fn fills(&self) -> &'static [Element] {
        use Element::*;
        match self {
            Source::MessageId => &[Uuid, Text],
            Source::Topic => &[Text],
            Source::Key | Source::Header(_) => &[Text, Bytea],
            Source::Partition => &[Int4, Int8],
            Source::Offset => &[Int8],
            Source::TimestampMs => &[Int8, Timestamptz],
            Source::Tombstone => &[Bool],
            Source::Value => &[Jsonb, Text, Bytea],
            Source::Pointer(_) => &[
                Int2,
                Int4,
                Int8,
                Float4,
                Float8,
                Text,
                Bool,
                Uuid,
                Jsonb,
                Timestamptz,
            ],
        }
    }
}

/// The element type of each parameter, or why the statement's parameters (`params`, from
/// PREPARE) do not fit `fields`.
pub(super) fn elements(fields: &[Field], params: &[Type]) -> Result<Vec<Element>, String> {
    if params.len() > fields.len() {
        return Err(format!(
            "the statement takes ${}, which is not declared: declare each parameter with a \
             line `{PREFIX} ${} = SOURCE`",
            fields.len() + 1,
            fields.len() + 1
        ));
    }
    if fields.len() > params.len() {
        return Err(format!(
            "${} is declared, but the statement takes {} parameter{}",
            params.len() + 1,
            params.len(),
            if params.len() == 1 { "" } else { "s" }
        ));
    }
    let mut out = Vec::with_capacity(fields.len());
    for (i, (field, ty)) in fields.iter().zip(params).enumerate() {
        let fills = field.source.fills();
        let names: Vec<&str> = fills.iter().map(|e| e.name()).collect();
        match Element::of(ty).filter(|e| fills.contains(e)) {
            Some(e) => out.push(e),
            None => {
                return Err(format!(
                    "${} ({}) is of type {}; it must be one of {} (cast it: ${}::{})",
                    i + 1,
                    field.source,
                    type_name(ty),
                    names.join(", "),
                    i + 1,
                    names[0]
                ))
            }
        }
    }
    Ok(out)
}

fn type_name(ty: &Type) -> String {
    match ty.kind() {
        Kind::Array(member) => format!("{}[]", member.name()),
        _ => ty.name().to_owned(),
    }
}

/// One parameter's array, one element per message.
#[derive(Debug)]
enum Column {
    Int2(Vec<Option<i16>>),
    Int4(Vec<Option<i32>>),
    Int8(Vec<Option<i64>>),
    Float4(Vec<Option<f32>>),
    Float8(Vec<Option<f64>>),
    Text(Vec<Option<String>>),
    Bool(Vec<Option<bool>>),
    Uuid(Vec<Option<Uuid>>),
    Jsonb(Vec<Option<Jsonb<String>>>),
    Bytea(Vec<Option<Vec<u8>>>),
    Timestamptz(Vec<Option<SystemTime>>),
}

/// One element, before it joins its column.
#[derive(Debug, PartialEq)]
enum Cell {
    Null,
    Int2(i16),
    Int4(i32),
    Int8(i64),
    Float4(f32),
    Float8(f64),
    Text(String),
    Bool(bool),
    Uuid(Uuid),
    Jsonb(Jsonb<String>),
    Bytea(Vec<u8>),
    Timestamptz(SystemTime),
}

impl Column {
    fn new(e: Element, n: usize) -> Self {
        match e {
            Element::Int2 => Column::Int2(Vec::with_capacity(n)),
            Element::Int4 => Column::Int4(Vec::with_capacity(n)),
            Element::Int8 => Column::Int8(Vec::with_capacity(n)),
            Element::Float4 => Column::Float4(Vec::with_capacity(n)),
            Element::Float8 => Column::Float8(Vec::with_capacity(n)),
            Element::Text => Column::Text(Vec::with_capacity(n)),
            Element::Bool => Column::Bool(Vec::with_capacity(n)),
            Element::Uuid => Column::Uuid(Vec::with_capacity(n)),
            Element::Jsonb => Column::Jsonb(Vec::with_capacity(n)),
            Element::Bytea => Column::Bytea(Vec::with_capacity(n)),
            Element::Timestamptz => Column::Timestamptz(Vec::with_capacity(n)),
        }
    }

    /// Appends `cell`, made for this column's element type by [`cell`].
    fn push(&mut self, cell: Cell) {
        fn put<T>(v: &mut Vec<Option<T>>, x: Option<T>) {
            v.push(x);
        }
        match (self, cell) {
            (Column::Int2(v), Cell::Int2(x)) => put(v, Some(x)),
            (Column::Int4(v), Cell::Int4(x)) => put(v, Some(x)),
            (Column::Int8(v), Cell::Int8(x)) => put(v, Some(x)),
            (Column::Float4(v), Cell::Float4(x)) => put(v, Some(x)),
            (Column::Float8(v), Cell::Float8(x)) => put(v, Some(x)),
            (Column::Text(v), Cell::Text(x)) => put(v, Some(x)),
            (Column::Bool(v), Cell::Bool(x)) => put(v, Some(x)),
            (Column::Uuid(v), Cell::Uuid(x)) => put(v, Some(x)),
            (Column::Jsonb(v), Cell::Jsonb(x)) => put(v, Some(x)),
            (Column::Bytea(v), Cell::Bytea(x)) => put(v, Some(x)),
            (Column::Timestamptz(v), Cell::Timestamptz(x)) => put(v, Some(x)),
            // NULL, or (never: `cell` makes the column's type) a cell of another type.
            (column, _) => column.push_null(),
        }
    }

    fn push_null(&mut self) {
        match self {
            Column::Int2(v) => v.push(None),
            Column::Int4(v) => v.push(None),
            Column::Int8(v) => v.push(None),
            Column::Float4(v) => v.push(None),
            Column::Float8(v) => v.push(None),
            Column::Text(v) => v.push(None),
            Column::Bool(v) => v.push(None),
            Column::Uuid(v) => v.push(None),
            Column::Jsonb(v) => v.push(None),
            Column::Bytea(v) => v.push(None),
            Column::Timestamptz(v) => v.push(None),
        }
    }

    fn as_sql(&self) -> &(dyn ToSql + Sync) {
        match self {
            Column::Int2(v) => v,
            Column::Int4(v) => v,
            Column::Int8(v) => v,
            Column::Float4(v) => v,
            Column::Float8(v) => v,
            Column::Text(v) => v,
            Column::Bool(v) => v,
            Column::Uuid(v) => v,
            Column::Jsonb(v) => v,
            Column::Bytea(v) => v,
            Column::Timestamptz(v) => v,
        }
    }
}

/// The statement's parameters for a batch: the messages that fit the declarations, by index in
/// the batch, and a rejection for each one that does not.
#[derive(Debug)]
pub(super) struct Input {
    columns: Vec<Column>,
    /// Indexes in the batch of the messages the columns hold, in order.
    pub(super) kept: Vec<usize>,
    pub(super) refused: Vec<Rejection>,
}

impl Input {
    /// The parameters, `$1` first.
    pub(super) fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.columns.iter().map(Column::as_sql).collect()
    }
}

/// Splits `messages` into the columns of `fields` (of types `elements`) and the refused.
pub(super) fn input(
    fields: &[Field],
    elements: &[Element],
    envelope: Envelope,
    messages: &[&Message<JsonPayload>],
) -> Input {
    let mut columns: Vec<Column> = elements
        .iter()
        .map(|&e| Column::new(e, messages.len()))
        .collect();
    let mut kept = Vec::with_capacity(messages.len());
    let mut refused = Vec::new();
    let mut cells = Vec::with_capacity(fields.len());
    let pointers = fields
        .iter()
        .any(|f| matches!(f.source, Source::Pointer(_)));
    let tombstones = fields.iter().any(|f| f.source == Source::Tombstone);
    for (i, m) in messages.iter().enumerate() {
        cells.clear();
        if m.payload.is_tombstone() && !tombstones {
            let detail = "the record has no value (a tombstone), and the statement declares no \
                          `tombstone` parameter to receive it";
            refused.push(Rejection::new(i, Reason::EmptyPayload, detail));
            continue;
        }
        let row = unwrap(envelope, &m.payload).and_then(|data| {
            // Parsed once, and only for a statement that reads fields of it.
            let root: Option<Value> = match (pointers, data) {
                (true, Some(text)) => Some(
                    serde_json::from_str(text)
                        .map_err(|e| format!("the value is not JSON: {e}"))?,
                ),
                _ => None,
            };
            for (field, &e) in fields.iter().zip(elements) {
                cells.push(cell(field, e, m, data, root.as_ref())?);
            }
            Ok(())
        });
        match row {
            Ok(()) => {
                kept.push(i);
                for (column, c) in columns.iter_mut().zip(cells.drain(..)) {
                    column.push(c);
                }
            }
            Err(detail) => refused.push(Rejection::new(i, Reason::InvalidPayload, detail)),
        }
    }
    Input {
        columns,
        kept,
        refused,
    }
}

/// The data of a message's value as JSON text, exactly as received: the value, or the
/// envelope's payload (the schema is skipped, not built); `None` for a tombstone or a value that
/// is not the record's own JSON (`--value-format text` or `bytes`).
pub(super) fn unwrap(envelope: Envelope, payload: &JsonPayload) -> Result<Option<&str>, String> {
    let Some(json) = payload.json() else {
        return Ok(None);
    };
    // Checked at decoding: JSON, hence UTF-8.
    let text = std::str::from_utf8(json).map_err(|e| format!("the value is not UTF-8: {e}"))?;
    match envelope {
        Envelope::None => Ok(Some(text)),
        Envelope::Connect => {
            let object = text.trim_start().starts_with('{');
            let read = object.then(|| serde_json::from_str::<Connect<'_>>(text).ok());
            match read.flatten().map(|c| c.payload) {
                Some(Slot::Given(payload)) => Ok(Some(payload.get())),
                _ => Err(
                    "the value is not a Kafka Connect JSON envelope: it has no \"payload\" field"
                        .to_owned(),
                ),
            }
        }
    }
}

/// Kafka Connect's JSON envelope: the payload's text, the schema skipped.
#[derive(serde::Deserialize)]
struct Connect<'a> {
    #[serde(borrow, default)]
    payload: Slot<'a>,
}

/// A member that may be missing (`null` is a value).
#[derive(Default)]
enum Slot<'a> {
    #[default]
    Missing,
    Given(&'a RawValue),
}

impl<'de: 'a, 'a> serde::Deserialize<'de> for Slot<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <&RawValue>::deserialize(d).map(Slot::Given)
    }
}

/// What a field is when it is not there.
enum Absent {
    Missing,
    Null,
}

/// The element of `field` for message `m` (`root`: its unwrapped value), or why it is refused.
fn cell(
    field: &Field,
    e: Element,
    m: &Message<JsonPayload>,
    data: Option<&str>,
    root: Option<&Value>,
) -> Result<Cell, String> {
    let got = match &field.source {
        // A tombstone has no value: its value fields are NULL, whatever `optional` says.
        Source::Value | Source::Pointer(_) if m.payload.is_tombstone() => return Ok(Cell::Null),
        source => from_source(source, e, m, data, root),
    };
    let problem = match got {
        Ok(Ok(cell)) => return Ok(cell),
        Ok(Err(Absent::Missing)) if field.optional => return Ok(Cell::Null),
        Ok(Err(Absent::Null)) if field.optional => return Ok(Cell::Null),
        Ok(Err(Absent::Missing)) => "is missing".to_owned(),
        Ok(Err(Absent::Null)) => "is null".to_owned(),
        Err(problem) => problem,
    };
    Err(format!("field {} {problem}", field.source))
}

type Got = Result<Result<Cell, Absent>, String>;

fn from_source(
    source: &Source,
    e: Element,
    m: &Message<JsonPayload>,
    data: Option<&str>,
    root: Option<&Value>,
) -> Got {
    let raw = &m.raw;
    Ok(Ok(match source {
        Source::MessageId => match e {
            Element::Uuid => Cell::Uuid(m.id),
            _ => Cell::Text(m.id.to_string()),
        },
        Source::Topic => Cell::Text(raw.topic.to_string()),
        Source::Partition => match e {
            Element::Int4 => Cell::Int4(raw.partition),
            _ => Cell::Int8(i64::from(raw.partition)),
        },
        Source::Offset => Cell::Int8(raw.offset),
        Source::Tombstone => Cell::Bool(m.payload.is_tombstone()),
        Source::TimestampMs => match raw.timestamp_ms {
            None => return Ok(Err(Absent::Missing)),
            Some(ms) if e == Element::Int8 => Cell::Int8(ms),
            Some(ms) => Cell::Timestamptz(time(ms)?),
        },
        Source::Key => match raw.key.as_deref() {
            None => return Ok(Err(Absent::Missing)),
            Some(bytes) => bytes_cell(e, bytes, "the key")?,
        },
        Source::Header(name) => match raw.headers.iter().rev().find(|h| h.key[..] == name[..]) {
            None => return Ok(Err(Absent::Missing)),
            Some(h) => match h.value.as_deref() {
                None => return Ok(Err(Absent::Null)),
                Some(bytes) => bytes_cell(e, bytes, "its value")?,
            },
        },
        // The data's text as received (an envelope's payload's), never re-written.
        Source::Value => match (e, data) {
            (Element::Jsonb, Some(text)) => Cell::Jsonb(Jsonb(text.to_owned())),
            (Element::Text, Some(text)) => Cell::Text(text.to_owned()),
            (Element::Bytea, _) => Cell::Bytea(raw.payload.as_deref().unwrap_or_default().to_vec()),
            // `text` and `bytes` values: the JSON built at decoding (a string, `{"hex": …}`).
            (Element::Jsonb, None) => Cell::Jsonb(Jsonb(
                String::from_utf8_lossy(m.payload.as_bytes()).into_owned(),
            )),
            _ => bytes_cell(e, raw.payload.as_deref().unwrap_or_default(), "the value")?,
        },
        Source::Pointer(pointer) => {
            let Some(root) = root else {
                return Err("cannot be read: the value is not parsed as JSON \
                            (--value-format json reads fields)"
                    .to_owned());
            };
            match root.pointer(pointer) {
                None => return Ok(Err(Absent::Missing)),
                Some(Value::Null) => return Ok(Err(Absent::Null)),
                Some(v) => json_cell(e, v)?,
            }
        }
    }))
}

/// Bytes as text (they must be UTF-8 without NUL) or `bytea`.
fn bytes_cell(e: Element, bytes: &[u8], what: &str) -> Result<Cell, String> {
    match e {
        Element::Bytea => Ok(Cell::Bytea(bytes.to_vec())),
        _ => clean_text(bytes)
            .map(|t| Cell::Text(t.to_owned()))
            .ok_or_else(|| {
                format!("is not text: {what} is not UTF-8 without NUL (read it as bytea[])")
            }),
    }
}

/// A JSON value as an element of type `e`.
fn json_cell(e: Element, v: &Value) -> Result<Cell, String> {
    let wrong = |expected: &str| format!("is {}, not {expected}", shown(v));
    let integer = |min: i64, max: i64, ty: &str| match v.as_i64() {
        Some(n) if (min..=max).contains(&n) => Ok(n),
        _ if v.is_number() => Err(format!(
            "is {}, not an integer from {min} to {max} ({ty})",
            shown(v)
        )),
        _ => Err(wrong(&format!("a number ({ty})"))),
    };
    Ok(match e {
        // The casts cannot truncate: `integer` checked the range.
        Element::Int2 => Cell::Int2(integer(i16::MIN.into(), i16::MAX.into(), "smallint")? as i16),
        Element::Int4 => Cell::Int4(integer(i32::MIN.into(), i32::MAX.into(), "integer")? as i32),
        Element::Int8 => Cell::Int8(integer(i64::MIN, i64::MAX, "bigint")?),
        Element::Float8 => Cell::Float8(v.as_f64().ok_or_else(|| wrong("a number"))?),
        Element::Float4 => {
            let x = v.as_f64().ok_or_else(|| wrong("a number"))?;
            if x.abs() > f64::from(f32::MAX) {
                return Err(format!("is {}, out of range for real", shown(v)));
            }
            Cell::Float4(x as f32)
        }
        Element::Text => Cell::Text(v.as_str().ok_or_else(|| wrong("a string"))?.to_owned()),
        Element::Bool => Cell::Bool(v.as_bool().ok_or_else(|| wrong("true or false"))?),
        Element::Uuid => {
            let text = v.as_str().ok_or_else(|| wrong("a UUID string"))?;
            Cell::Uuid(Uuid::parse_str(text.trim()).map_err(|_| wrong("a UUID"))?)
        }
        Element::Jsonb => Cell::Jsonb(Jsonb(v.to_string())),
        Element::Timestamptz => match (v.as_i64(), v.as_str()) {
            (Some(ms), _) => Cell::Timestamptz(time(ms)?),
            (None, Some(text)) => match text.parse::<jiff::Timestamp>() {
                Ok(t) => Cell::Timestamptz(time(t.as_millisecond())?),
                Err(_) => return Err(wrong("an RFC 3339 time")),
            },
            _ => {
                return Err(wrong(
                    "milliseconds since the epoch or an RFC 3339 time (timestamptz)",
                ))
            }
        },
        Element::Bytea => return Err(wrong("bytes")),
    })
}

/// The first characters of `v`'s JSON text, for a detail.
fn shown(v: &Value) -> String {
    let text = v.to_string();
    match text.char_indices().nth(60) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// The years PostgreSQL's `timestamptz` and every client read alike: 0001 to 9999.
const MIN_MS: i64 = -62_135_596_800_000;
const MAX_MS: i64 = 253_402_300_799_999;

/// Milliseconds since the epoch as a time, within years 0001 to 9999.
fn time(ms: i64) -> Result<SystemTime, String> {
    if !(MIN_MS..=MAX_MS).contains(&ms) {
        return Err(format!(
            "is {ms} ms since the epoch, outside years 0001 to 9999"
        ));
    }
    let d = Duration::from_millis(ms.unsigned_abs());
    Ok(match ms >= 0 {
        true => UNIX_EPOCH + d,
        false => UNIX_EPOCH - d,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;

    use super::*;
    use crate::pipeline::message::tests::raw;
    use crate::pipeline::message::{Decode, Decoding, Header, Tombstones};

    fn field(source: Source) -> Field {
        Field {
            source,
            optional: false,
        }
    }

    #[test]
    fn declarations_are_read_from_the_file() {
        let sql = "-- balances\n  -- batch-inbox: $2 = value /amount optional\n\
                   --batch-inbox: $9 = nothing\n-- batch-inbox: $1 = header \"ce type\"\n\
                   -- batch-inbox: envelope = connect\nSELECT 1";
        let d = declarations(sql).unwrap();
        assert_eq!(d.envelope, Envelope::Connect);
        assert_eq!(
            d.fields,
            vec![
                field(Source::Header(b"ce type".to_vec())),
                Field {
                    source: Source::Pointer("/amount".to_owned()),
                    optional: true
                },
            ]
        );
        assert_eq!(declarations("SELECT $1").unwrap(), Declarations::default());
        for (bad, says) in [
            (
                "-- batch-inbox: $1 = value\n-- batch-inbox: $1 = key",
                "line 2: $1 is declared twice",
            ),
            ("-- batch-inbox: $2 = key", "$1 is not declared"),
            ("-- batch-inbox: $0 = key", "\"$0\" is not a parameter"),
            ("-- batch-inbox: $1 = price", "\"price\" is not a source"),
            ("-- batch-inbox: $1 = header", "needs a header name"),
            ("-- batch-inbox: $1 = key maybe", "unexpected \"maybe\""),
            ("-- batch-inbox: $1 key", "expected `$N = message_id"),
            (
                "-- batch-inbox: envelope = avro",
                "expected `connect` or `none`",
            ),
            ("-- batch-inbox: $1 = header \"open", "unterminated string"),
        ] {
            let e = declarations(bad).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }

    #[test]
    fn each_parameter_must_be_an_array_its_source_fills() {
        let fields = [
            field(Source::MessageId),
            field(Source::Pointer("/a".to_owned())),
        ];
        let uuids = Type::UUID_ARRAY;
        assert_eq!(
            elements(&fields, &[uuids.clone(), Type::INT8_ARRAY]).unwrap(),
            [Element::Uuid, Element::Int8]
        );
        let e = elements(&fields, &[uuids.clone(), Type::NUMERIC_ARRAY]).unwrap_err();
        assert!(
            e.starts_with("$2 (value /a) is of type numeric[]; it must be one of smallint[]"),
            "{e}"
        );
        let e = elements(&fields, &[Type::INT8, Type::INT8_ARRAY]).unwrap_err();
        assert!(
            e.contains("$1 (message_id) is of type int8; it must be one of uuid[], text[]"),
            "{e}"
        );
        let e = elements(&fields, std::slice::from_ref(&uuids)).unwrap_err();
        assert!(
            e.contains("$2 is declared, but the statement takes 1 parameter"),
            "{e}"
        );
        let e = elements(&fields[..1], &[uuids.clone(), uuids]).unwrap_err();
        assert!(
            e.contains("the statement takes $2, which is not declared"),
            "{e}"
        );
    }

    fn message(value: Option<&str>) -> Message<JsonPayload> {
        let mut r = raw(7, None, "");
        r.payload = value.map(|v| Bytes::copy_from_slice(v.as_bytes()));
        r.key = Some(Bytes::from_static(b"k\xff"));
        r.headers.push(Header {
            key: Bytes::from_static(b"kind"),
            value: Some(Bytes::from_static(b"first")),
        });
        r.headers.push(Header {
            key: Bytes::from_static(b"kind"),
            value: Some(Bytes::from_static(b"last")),
        });
        let d = Decoding {
            tombstones: Tombstones::Pass,
            ..Decoding::default()
        };
        Message {
            id: Uuid::from_u128(9),
            payload: JsonPayload::decode_with(&r, &d).unwrap(),
            raw: Arc::new(r),
        }
    }

    fn one(source: Source, e: Element, value: Option<&str>) -> Result<Cell, String> {
        let m = message(value);
        let data = unwrap(Envelope::None, &m.payload).unwrap();
        let root: Option<Value> = data.map(|d| serde_json::from_str(d).unwrap());
        cell(&field(source), e, &m, data, root.as_ref())
    }

    fn at(pointer: &str, e: Element, value: &str) -> Result<Cell, String> {
        one(Source::Pointer(pointer.to_owned()), e, Some(value))
    }

    #[test]
    fn fields_are_typed_or_refused_naming_the_field() {
        let v = r#"{"n": 5, "big": 9223372036854775808, "f": 1.5, "s": "x", "b": true,
                    "u": "0191E5A0-0000-7000-8000-000000000001", "z": null, "o": {"a": [1]},
                    "t": "2026-12-02T10:00:00.250Z", "neg": -40000}"#;
        assert_eq!(at("/n", Element::Int2, v), Ok(Cell::Int2(5)));
        assert_eq!(at("/n", Element::Int8, v), Ok(Cell::Int8(5)));
        assert_eq!(at("/n", Element::Float8, v), Ok(Cell::Float8(5.0)));
        assert_eq!(at("/f", Element::Float4, v), Ok(Cell::Float4(1.5)));
        assert_eq!(at("/s", Element::Text, v), Ok(Cell::Text("x".to_owned())));
        assert_eq!(at("/b", Element::Bool, v), Ok(Cell::Bool(true)));
        assert_eq!(
            at("/u", Element::Uuid, v),
            Ok(Cell::Uuid(
                "0191e5a0-0000-7000-8000-000000000001".parse().unwrap()
            ))
        );
        assert_eq!(
            at("/o", Element::Jsonb, v),
            Ok(Cell::Jsonb(Jsonb("{\"a\":[1]}".to_owned())))
        );
        assert_eq!(
            at("/t", Element::Timestamptz, v),
            Ok(Cell::Timestamptz(
                UNIX_EPOCH + Duration::from_millis(1_796_205_600_250)
            ))
        );
        assert_eq!(
            at("/neg", Element::Timestamptz, v),
            Ok(Cell::Timestamptz(
                UNIX_EPOCH - Duration::from_millis(40_000)
            ))
        );
        for (pointer, e, says) in [
            ("/big", Element::Int8, "field value /big is 9223372036854775808, not an integer from -9223372036854775808 to 9223372036854775807 (bigint)"),
            ("/neg", Element::Int2, "field value /neg is -40000, not an integer from -32768 to 32767 (smallint)"),
            ("/f", Element::Int4, "field value /f is 1.5, not an integer"),
            ("/s", Element::Int8, "field value /s is \"x\", not a number (bigint)"),
            ("/n", Element::Text, "field value /n is 5, not a string"),
            ("/s", Element::Uuid, "field value /s is \"x\", not a UUID"),
            ("/n", Element::Bool, "field value /n is 5, not true or false"),
            ("/z", Element::Int8, "field value /z is null"),
            ("/gone", Element::Int8, "field value /gone is missing"),
            ("/o/a/0/x", Element::Int8, "field value /o/a/0/x is missing"),
            ("/s", Element::Timestamptz, "field value /s is \"x\", not an RFC 3339 time"),
        ] {
            match at(pointer, e, v) {
                Err(detail) => assert!(detail.starts_with(says), "{pointer}: {detail}"),
                Ok(c) => panic!("{pointer}: {c:?}"),
            }
        }
        let e = at("/e", Element::Float4, "{\"e\": 1e300}").unwrap_err();
        assert_eq!(e, "field value /e is 1e+300, out of range for real");
        assert!(
            at("/n", Element::Timestamptz, "{\"n\": 9223372036854775807}")
                .unwrap_err()
                .contains("outside years 0001 to 9999")
        );
    }

    #[test]
    fn optional_fields_are_null_and_tombstones_have_no_value_fields() {
        let m = message(Some("{\"z\": null}"));
        let parsed: Value = serde_json::json!({"z": null});
        let root = Some(&parsed);
        let opt = |s: &str| Field {
            source: Source::Pointer(s.to_owned()),
            optional: true,
        };
        assert_eq!(
            cell(&opt("/z"), Element::Int8, &m, None, root),
            Ok(Cell::Null)
        );
        assert_eq!(
            cell(&opt("/q"), Element::Int8, &m, None, root),
            Ok(Cell::Null)
        );
        let bad = Field {
            source: Source::Pointer("/z".to_owned()),
            optional: true,
        };
        let wrong = message(Some("{\"z\": \"1\"}"));
        let parsed: Value = serde_json::json!({"z": "1"});
        assert!(
            cell(&bad, Element::Int8, &wrong, None, Some(&parsed)).is_err(),
            "optional is about absence, never a wrong type"
        );
        for (source, e) in [
            (Source::Pointer("/a".to_owned()), Element::Int8),
            (Source::Value, Element::Jsonb),
            (Source::Value, Element::Bytea),
        ] {
            assert_eq!(one(source, e, None), Ok(Cell::Null));
        }
        assert_eq!(
            one(Source::Tombstone, Element::Bool, None),
            Ok(Cell::Bool(true))
        );
    }

    #[test]
    fn record_fields_keys_and_headers() {
        let v = Some("[1]");
        assert_eq!(one(Source::Offset, Element::Int8, v), Ok(Cell::Int8(7)));
        assert_eq!(one(Source::Partition, Element::Int4, v), Ok(Cell::Int4(0)));
        assert_eq!(
            one(Source::Topic, Element::Text, v),
            Ok(Cell::Text("t".to_owned()))
        );
        assert_eq!(
            one(Source::MessageId, Element::Uuid, v),
            Ok(Cell::Uuid(Uuid::from_u128(9)))
        );
        assert_eq!(
            one(Source::Key, Element::Bytea, v),
            Ok(Cell::Bytea(b"k\xff".to_vec()))
        );
        assert_eq!(
            one(Source::Key, Element::Text, v),
            Err(
                "field key is not text: the key is not UTF-8 without NUL (read it as bytea[])"
                    .to_owned()
            )
        );
        assert_eq!(
            one(Source::Header(b"kind".to_vec()), Element::Text, v),
            Ok(Cell::Text("last".to_owned()))
        );
        assert_eq!(
            one(Source::Header(b"none".to_vec()), Element::Text, v),
            Err("field header none is missing".to_owned())
        );
        assert_eq!(
            one(Source::Value, Element::Text, v),
            Ok(Cell::Text("[1]".to_owned()))
        );
        assert_eq!(
            one(Source::Value, Element::Jsonb, v),
            Ok(Cell::Jsonb(Jsonb("[1]".to_owned())))
        );
        // The value's text as received: every digit kept, spacing too.
        let exact = r#"{"n": 123456789012345678901234567890, "x": 0.10000000000000000001}"#;
        assert_eq!(
            one(Source::Value, Element::Jsonb, Some(exact)),
            Ok(Cell::Jsonb(Jsonb(exact.to_owned())))
        );
    }

    #[test]
    fn the_connect_envelope_is_unwrapped_or_refused() {
        let ok = message(Some(
            r#"{"schema": {"type": "struct"}, "payload": {"a": 3, "big": 123456789012345678901234567890}}"#,
        ));
        let data = unwrap(Envelope::Connect, &ok.payload).unwrap();
        let payload = r#"{"a": 3, "big": 123456789012345678901234567890}"#;
        assert_eq!(data, Some(payload), "the payload's text as received");
        let f = field(Source::Value);
        assert_eq!(
            cell(&f, Element::Text, &ok, data, None),
            Ok(Cell::Text(payload.to_owned()))
        );
        let null = message(Some(r#"{"payload": null, "schema": {"x": [1, {"y": 2}]}}"#));
        assert_eq!(unwrap(Envelope::Connect, &null.payload), Ok(Some("null")));
        for bad in [r#"{"a": 3}"#, "[1]", "3", "[{\"payload\": 1}]"] {
            let m = message(Some(bad));
            assert!(unwrap(Envelope::Connect, &m.payload)
                .unwrap_err()
                .contains("not a Kafka Connect JSON envelope"));
        }
        assert_eq!(unwrap(Envelope::Connect, &message(None).payload), Ok(None));
    }

    #[test]
    fn a_batch_is_split_into_columns_and_refusals() {
        let fields = [
            field(Source::MessageId),
            field(Source::Pointer("/n".to_owned())),
        ];
        let ms = [
            message(Some("{\"n\": 1}")),
            message(Some("{\"n\": \"1\"}")),
            message(Some("{\"n\": 3}")),
        ];
        let refs: Vec<&Message<JsonPayload>> = ms.iter().collect();
        let input = input(
            &fields,
            &[Element::Uuid, Element::Int8],
            Envelope::None,
            &refs,
        );
        assert_eq!(input.kept, [0, 2]);
        assert_eq!(input.refused.len(), 1);
        assert_eq!(input.refused[0].index, 1);
        assert_eq!(input.refused[0].reason, Reason::InvalidPayload);
        match &input.columns[1] {
            Column::Int8(v) => assert_eq!(v, &[Some(1), Some(3)]),
            other => panic!("{other:?}"),
        }
        match &input.columns[0] {
            Column::Uuid(v) => assert_eq!(v.len(), 2, "a refused message leaves no element"),
            other => panic!("{other:?}"),
        }
        assert_eq!(input.params().len(), 2);

        // A tombstone reaches only a statement that declares `tombstone`.
        let tombstone = [message(None)];
        let refs: Vec<&Message<JsonPayload>> = tombstone.iter().collect();
        let refused = super::input(
            &fields,
            &[Element::Uuid, Element::Int8],
            Envelope::None,
            &refs,
        );
        assert!(refused.kept.is_empty());
        assert_eq!(refused.refused[0].reason, Reason::EmptyPayload);
        let with = [
            field(Source::Tombstone),
            field(Source::Pointer("/n".to_owned())),
        ];
        let taken = super::input(
            &with,
            &[Element::Bool, Element::Int8],
            Envelope::None,
            &refs,
        );
        assert_eq!(taken.kept, [0]);
        match &taken.columns[1] {
            Column::Int8(v) => assert_eq!(v, &[None], "a tombstone's value fields are NULL"),
            other => panic!("{other:?}"),
        }
    }
}
