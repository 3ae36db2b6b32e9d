//! Plain-text tables and the number formats the listings share, so that
//! `ls`, `status` and `ckpt ls` line up the same way.

use std::fmt::Write as _;
use std::time::Duration;

/// Left-aligned columns, two spaces apart, the header first.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<&str>, out: &mut String| {
        let text: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", text.join("  ").trim_end());
    };
    line(header.to_vec(), &mut out);
    for row in rows {
        line(row.iter().map(String::as_str).collect(), &mut out);
    }
    out
}

/// `4.2s`, `3m05s`, `2h10m`; `-` when unknown.
pub fn duration_text(d: Option<Duration>) -> String {
    let Some(d) = d else { return "-".into() };
    let s = d.as_secs();
    match s {
        0..60 => format!("{:.1}s", d.as_secs_f64()),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// Four decimals, or scientific notation for very large or small values.
pub fn number(v: f64) -> String {
    if v != 0.0 && (v.abs() >= 1e5 || v.abs() < 1e-3) {
        format!("{v:.3e}")
    } else {
        format!("{v:.4}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_whatever_the_widths() {
        let rows = vec![
            vec!["5".to_string(), "123456".to_string(), "a".to_string()],
            vec!["100".to_string(), "7".to_string(), String::new()],
        ];
        assert_eq!(
            table(&["STEP", "BYTES", "PATH"], &rows),
            "STEP  BYTES   PATH\n5     123456  a\n100   7\n"
        );
    }
}
