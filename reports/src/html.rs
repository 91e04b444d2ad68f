//! HTML pieces every report shares: the error type, escaping, the stylesheet, a chart section and a
//! polars DataFrame as a table.

use std::fmt::Write;

/// Why a report could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("drawing chart `{chart}`: {message}")]
    Chart { chart: &'static str, message: String },
    #[error("report table: {0}")]
    Table(#[from] polars::prelude::PolarsError),
}

/// A DataFrame as an HTML table: floats with 3 decimals, nulls as "–".
pub fn frame_html(df: &polars::prelude::DataFrame) -> Result<String, ReportError> {
    use polars::prelude::AnyValue;
    let mut o = String::from("<table><tr>");
    for name in df.get_column_names() {
        let _ = write!(o, "<th>{}</th>", esc(name));
    }
    o.push_str("</tr>");
    for i in 0..df.height() {
        o.push_str("<tr>");
        for c in df.columns() {
            let text = match c.get(i)? {
                AnyValue::Null => "–".to_string(),
                AnyValue::Float64(x) => format!("{x:.3}"),
                AnyValue::Float32(x) => format!("{x:.3}"),
                AnyValue::String(s) => esc(s),
                AnyValue::StringOwned(s) => esc(&s),
                v => esc(&v.to_string()),
            };
            let _ = write!(o, "<td>{text}</td>");
        }
        o.push_str("</tr>");
    }
    o.push_str("</table>");
    Ok(o)
}

/// One chart section: its heading, the SVG and its caption.
pub fn section(o: &mut String, id: &str, title: &str, svg: &str, caption: &str) {
    let _ = writeln!(
        o,
        "<section id=\"{id}\"><h2>{title}</h2><figure>{svg}<figcaption>{caption}</figcaption></figure></section>"
    );
}

pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

pub const CSS: &str = "body{font-family:sans-serif;margin:2em auto;max-width:960px;color:#222}\
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}\
td:first-child{text-align:left}.better{color:#11772d}.worse{color:#b3261e}figure{margin:0}\
figcaption{color:#555;font-size:0.9em}section{margin-bottom:2em}";
