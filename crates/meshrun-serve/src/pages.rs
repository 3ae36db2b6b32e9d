//! The pages: the list of runs, and a run's report page (drawn by
//! `meshrun_report`), each with the one inline script that keeps it live.

use std::fmt::Write as _;
use std::path::Path;

use meshrun_report::html::{escape, fmt_num};
use meshrun_report::model::Run;
use meshrun_report::timeline::state_color;

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222}\
table{border-collapse:collapse}td,th{padding:4px 12px;border-bottom:1px solid #ddd;text-align:left}\
.swatch{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:6px}";

/// The script that keeps a page live: each `update` event of `stream`
/// carries the page's new body. No reload, nothing fetched but the stream.
fn script(stream: &str) -> String {
    let url = serde_json::to_string(stream).expect("a string serializes");
    format!(
        "<script>(function(){{var s=new EventSource({url});\
         s.addEventListener('update',function(e){{document.body.innerHTML=e.data;}});}})();</script>"
    )
}

/// A whole page around `body`, live from `stream`.
pub fn live(title: &str, body: &str, stream: &str) -> String {
    format!(
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">{NO_ICON}<title>{}</title><style>{STYLE}</style>{}</head><body>{body}</body></html>"#,
        escape(title),
        script(stream)
    )
}

/// Says the page has no icon, so that a browser asks for none (the
/// report file itself links nothing).
const NO_ICON: &str = r#"<link rel="icon" href="data:,">"#;

/// A report page made live from `stream`.
pub fn with_stream(page: &str, stream: &str) -> String {
    match page.find("</head>") {
        Some(at) => format!("{}{NO_ICON}{}{}", &page[..at], script(stream), &page[at..]),
        None => page.to_string(),
    }
}

/// What is inside a page's `<body>`.
pub fn body_of(page: &str) -> String {
    let start = page.find("<body>").map_or(0, |i| i + "<body>".len());
    let end = page.rfind("</body>").unwrap_or(page.len());
    page[start..end.max(start)].to_string()
}

/// The report page of the run in `dir`, or a page that says why there is
/// none (yet).
pub fn run_page(dir: &Path) -> String {
    match Run::load(dir) {
        Ok(run) => meshrun_report::html::page(&run),
        Err(e) => live(
            "meshrun run",
            &format!("<p>{}</p>", escape(&e.to_string())),
            "",
        ),
    }
}

/// The table of the runs in `runs_dir`, newest first.
pub fn list_body(runs_dir: &Path, token: Option<&str>) -> String {
    let mut runs: Vec<Run> = std::fs::read_dir(runs_dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| Run::load(&e.path()).ok())
        .collect();
    runs.sort_by(|a, b| b.start.unwrap_or(0.0).total_cmp(&a.start.unwrap_or(0.0)));
    let query = token.map_or_else(String::new, |t| format!("?token={}", escape(t)));
    let mut s = format!(
        "<h1>meshrun runs</h1><p>in {}</p>",
        escape(&runs_dir.display().to_string())
    );
    if runs.is_empty() {
        s.push_str("<p>No runs yet.</p>");
        return s;
    }
    s.push_str(r#"<table id="runs"><thead><tr><th>run</th><th>state</th><th>attempts</th><th>step</th><th>loss</th></tr></thead><tbody>"#);
    for run in &runs {
        let state = run
            .state
            .map_or_else(|| "starting".to_string(), |s| s.to_string());
        let num = |v: Option<f64>| v.map_or_else(|| "–".to_string(), fmt_num);
        let _ = write!(
            s,
            r#"<tr data-run="{name}" data-state="{state}"><td><a href="/runs/{name}{query}">{name}</a></td><td><span class="swatch" style="background:{}"></span>{state}</td><td>{}</td><td>{}</td><td>{}</td></tr>"#,
            state_color(run.state),
            run.attempts.len(),
            num(run.final_step()),
            num(run.last_loss()),
            name = escape(&run.name),
        );
    }
    s.push_str("</tbody></table>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_page_gets_the_script_in_its_head_and_gives_its_body() {
        let page =
            "<!doctype html><html><head><title>t</title></head><body><main>x</main></body></html>";
        let live = with_stream(page, "/runs/a/stream?token=\"q\"");
        assert!(
            live.contains(r#"new EventSource("/runs/a/stream?token=\"q\"")"#),
            "{live}"
        );
        assert!(live.find("<script>").unwrap() < live.find("</head>").unwrap());
        assert_eq!(body_of(&live), "<main>x</main>");
    }
}
