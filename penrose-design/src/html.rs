//! The report as one self-contained HTML page (`penrose-design report --html DIR`).
//!
//! Inline CSS and inline SVG ([`crate::plot`]); no script, no external resource, and a
//! Content-Security-Policy that allows neither, so the page opens from a file in any browser
//! with no server. Every text is escaped ([`escape`]): labels are user input.
//!
//! The page: a header (bundles, epochs, k, T, whether admission tokens enforced the contributor
//! bound, what was held back, quarantined or withheld), the fleet overview (classes by
//! reports), a section per decrypted class (its id, label, the classes merged into it, and per
//! counter its histogram and statistics; per joint view its heat map and the shares of its
//! quadrants), then the (class, counter)s under the threshold
//! (listed, never drawn), quarantined sums and skipped epochs.

use std::fmt::Write as _;

use crate::joint::JointSummary;
use crate::plot::{self, escape};
use crate::report::{CounterReport, Report};
use crate::scale::human;

const STYLE: &str = "body{font-family:sans-serif;margin:2em auto;max-width:60em;color:#222;\
padding:0 1em}h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;\
margin-top:2em}.label{color:#3b6ea8}table{border-collapse:collapse;margin:.5em 0 1.5em}\
td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left}td.n{text-align:right;\
font-variant-numeric:tabular-nums}dl{display:grid;grid-template-columns:max-content auto;\
gap:.2em 1em}dt{font-weight:bold}dd{margin:0}.counter{margin-left:1em}\
.no{color:#a33}svg{max-width:100%;height:auto;display:block}nav a{margin-right:.6em}";

/// A class as the page names it: `class 7` and its label, escaped.
fn class_name(report: &Report, class: u32) -> String {
    match report.labels.get(&class) {
        Some(l) => format!(
            r#"class {class} <span class="label">({})</span>"#,
            escape(l.as_str())
        ),
        None => format!("class {class}"),
    }
}

fn row(out: &mut String, cells: &[(&str, String)]) {
    out.push_str("<tr>");
    for (class, cell) in cells {
        if class.is_empty() {
            let _ = write!(out, "<td>{cell}</td>");
        } else {
            let _ = write!(out, r#"<td class="{class}">{cell}</td>"#);
        }
    }
    out.push_str("</tr>");
}

fn stat(v: Option<f64>, unit: &str) -> String {
    v.map_or("-".to_string(), |v| escape(&human(v, unit)))
}

/// One counter's statistics table.
fn counter_table(c: &CounterReport) -> String {
    let mut t = String::from(r#"<table class="stats"><tbody>"#);
    let epochs = match (c.epochs.first(), c.epochs.last()) {
        (Some(a), Some(b)) if a != b => format!("{} ({a} to {b})", c.epochs.len()),
        (Some(a), _) => format!("1 ({a})"),
        _ => "0".to_string(),
    };
    let tokens = if c.bound_enforced_by_tokens {
        "yes".to_string()
    } else {
        r#"<span class="no">no</span>"#.to_string()
    };
    let rows: [(&str, String); 13] = [
        ("GPU architecture", escape(&c.arch)),
        ("reports", c.reports.to_string()),
        ("samples", c.samples.to_string()),
        (
            "contributors, at least",
            c.contributors_at_least.to_string(),
        ),
        ("released sums decrypted", c.sums.to_string()),
        ("epochs", epochs),
        (
            "reports held back (sums under the threshold)",
            c.held_back_reports.to_string(),
        ),
        ("contributor bound enforced by admission tokens", tokens),
        ("mean", stat(c.mean, &c.unit)),
        ("p50", stat(c.p50, &c.unit)),
        ("p90", stat(c.p90, &c.unit)),
        ("p99", stat(c.p99, &c.unit)),
        (
            "counter",
            format!("{} (catalogue {})", c.counter, c.catalogue),
        ),
    ];
    for (name, value) in rows {
        if c.joint.is_some() && ["mean", "p50", "p90", "p99"].contains(&name) {
            continue;
        }
        let _ = write!(t, r#"<tr><th>{name}</th><td class="n">{value}</td></tr>"#);
    }
    t.push_str("</tbody></table>");
    t
}

/// A joint view's quadrants: what each covers and its share of samples (and of kernel time,
/// where an axis is a duration).
fn quadrant_table(j: &JointSummary) -> String {
    let timed = j.quadrants.iter().any(|q| q.time_share.is_some());
    let mut t = String::from(
        r#"<table class="quadrants"><thead><tr><th>quadrant</th><th>samples</th><th>share of samples</th>"#,
    );
    if timed {
        t.push_str("<th>share of kernel time (bounds)</th>");
    }
    t.push_str("</tr></thead><tbody>");
    for q in &j.quadrants {
        let mut cells = vec![
            ("", escape(&j.describe(q))),
            ("n", q.samples.to_string()),
            ("n", format!("{:.1}%", q.share * 100.0)),
        ];
        if let Some(e) = q.time_share {
            cells.push((
                "n",
                format!(
                    "{:.1}% ({:.1}% to {:.1}%)",
                    e.estimate * 100.0,
                    e.low * 100.0,
                    e.high * 100.0
                ),
            ));
        } else if timed {
            cells.push(("n", "-".to_string()));
        }
        row(&mut t, &cells);
    }
    t.push_str("</tbody></table>");
    if j.x.asked != j.x.split || j.y.asked != j.y.split {
        let _ = write!(
            t,
            "<p>Split asked at {} = {} and {} = {}; the grid splits only at cell edges, so at              {} and {}.</p>",
            escape(&j.x.counter),
            escape(&human(j.x.asked, &j.x.unit)),
            escape(&j.y.counter),
            escape(&human(j.y.asked, &j.y.unit)),
            escape(&human(j.x.split, &j.x.unit)),
            escape(&human(j.y.split, &j.y.unit)),
        );
    }
    t
}

/// The page.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    out.push_str(concat!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/>",
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; ",
        "style-src 'unsafe-inline'\"/>",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"/>",
        "<title>Penrose design report</title><style>"
    ));
    out.push_str(STYLE);
    out.push_str("</style></head><body><header><h1>Penrose design report</h1><dl>");
    for (name, value) in facts(report) {
        let _ = write!(out, "<dt>{name}</dt><dd>{value}</dd>");
    }
    out.push_str("</dl></header>");
    let classes = plot::classes_by_reports(report);
    if !classes.is_empty() {
        out.push_str("<nav>Classes: ");
        for (class, _) in &classes {
            let _ = write!(out, r##"<a href="#class-{class}">{class}</a>"##);
        }
        out.push_str("</nav>");
    }
    out.push_str(r#"<section id="overview"><h2>Fleet overview</h2>"#);
    out.push_str(&plot::overview(report));
    out.push_str("</section>");
    for &(class, reports) in &classes {
        class_section(&mut out, report, class, reports);
    }
    withheld_section(&mut out, report);
    quarantined_section(&mut out, report);
    skipped_section(&mut out, report);
    let _ = writeln!(
        out,
        "<footer><p>penrose-design {}: no script, no external resource.</p></footer></body></html>",
        env!("CARGO_PKG_VERSION")
    );
    out
}

/// The header's facts: what was imported and decrypted under which rule.
fn facts(report: &Report) -> [(&'static str, String); 9] {
    let tokens = if report.bound_enforced_by_tokens {
        "yes".to_string()
    } else {
        format!(
            r#"<span class="no">{}</span>"#,
            escape(&report.admission_line())
        )
    };
    [
        ("bundles imported", report.bundles.to_string()),
        ("epochs released", report.epochs.to_string()),
        (
            "threshold k",
            format!("{} contributors", report.threshold.get()),
        ),
        (
            "T",
            format!(
                "{} reports per contributor, counter and day",
                report.reports_per_contributor.get()
            ),
        ),
        ("contributor bound enforced by admission tokens", tokens),
        (
            "decrypted",
            format!(
                "{} (class, counter) aggregates in {} classes",
                report.decrypted.len(),
                report.classes()
            ),
        ),
        (
            "held back (under k)",
            format!("{} (class, counter)s", report.held_back.len()),
        ),
        ("quarantined", format!("{} sums", report.quarantined.len())),
        (
            "withheld by the aggregation server",
            format!(
                "{} sums ({} reports) under its threshold",
                report.withheld_sums, report.withheld_reports
            ),
        ),
    ]
}

/// One class: its decrypted counters, each with its plot and table.
fn class_section(out: &mut String, report: &Report, class: u32, reports: u64) {
    let _ = write!(
        out,
        r#"<section class="class" id="class-{class}"><h2>{}</h2><p>{reports} reports decrypted, all counters."#,
        class_name(report, class)
    );
    let counters: Vec<&CounterReport> = report
        .decrypted
        .iter()
        .filter(|c| c.class == class)
        .collect();
    let mut merged: Vec<u32> = counters
        .iter()
        .flat_map(|c| c.merged_from.iter().copied())
        .collect();
    merged.sort_unstable();
    merged.dedup();
    if !merged.is_empty() {
        let names: Vec<String> = merged.iter().map(|m| class_name(report, *m)).collect();
        let _ = write!(
            out,
            " With the sums of {}, which the aggregation server merged into it.",
            names.join(", ")
        );
    }
    out.push_str("</p>");
    for c in counters {
        counter_section(out, report, class, c);
    }
    out.push_str("</section>");
}

fn counter_section(out: &mut String, report: &Report, class: u32, c: &CounterReport) {
    let unit = if c.unit.is_empty() {
        String::new()
    } else {
        format!(" ({})", escape(&c.unit))
    };
    let _ = write!(
        out,
        r#"<div class="counter" id="class-{class}-{}-counter-{}"><h3>{}{unit}, {}</h3>"#,
        escape(&c.arch),
        c.counter,
        escape(&c.name),
        escape(&c.arch)
    );
    let label = report.labels.get(&class).map(|l| l.as_str());
    match &c.joint {
        Some(j) => {
            out.push_str(&plot::heatmap(c, j, label));
            out.push_str(&quadrant_table(j));
        }
        None => out.push_str(&plot::histogram(c, label)),
    }
    out.push_str(&counter_table(c));
    out.push_str("</div>");
}

fn withheld_section(out: &mut String, report: &Report) {
    out.push_str(r#"<section id="withheld"><h2>Withheld: under the threshold</h2>"#);
    if report.held_back.is_empty() {
        out.push_str("<p>No (class, counter) was held back.</p>");
    } else {
        out.push_str(
            "<p>Every released sum of these is under k contributors: not decrypted, not \
             drawn.</p><table><thead><tr><th>class</th><th>architecture</th><th>counter</th><th>reports</th>\
             <th>contributors, at least (largest sum)</th></tr></thead><tbody>",
        );
        for h in &report.held_back {
            row(
                out,
                &[
                    ("", class_name(report, h.class)),
                    ("", escape(&h.arch)),
                    ("n", h.counter.to_string()),
                    ("n", h.reports.to_string()),
                    ("n", h.contributors_at_least.to_string()),
                ],
            );
        }
        out.push_str("</tbody></table>");
    }
    let _ = write!(
        out,
        "<p>The aggregation server withheld {} sums ({} reports) under its own threshold; they \
         were never exported.</p></section>",
        report.withheld_sums, report.withheld_reports
    );
}

fn quarantined_section(out: &mut String, report: &Report) {
    if report.quarantined.is_empty() {
        return;
    }
    out.push_str(
        r#"<section id="quarantined"><h2>Quarantined</h2><p>These released sums did not decrypt to a histogram of their declared samples: not added.</p><table><thead><tr><th>class</th><th>architecture</th><th>counter</th><th>epoch</th><th>generation</th><th>reports</th><th>reason</th></tr></thead><tbody>"#,
    );
    for q in &report.quarantined {
        row(
            out,
            &[
                ("", class_name(report, q.class)),
                ("", escape(&q.arch)),
                ("n", q.counter.to_string()),
                ("n", q.epoch.to_string()),
                ("n", q.generation.to_string()),
                ("n", q.reports.to_string()),
                ("", escape(&q.reason)),
            ],
        );
    }
    out.push_str("</tbody></table></section>");
}

fn skipped_section(out: &mut String, report: &Report) {
    if report.skipped_epochs.is_empty() {
        return;
    }
    out.push_str(
        r#"<section id="skipped"><h2>Skipped epochs</h2><p>Released again by a restored chain, never merged twice.</p><ul>"#,
    );
    for (chain, epoch) in &report.skipped_epochs {
        let _ = write!(out, "<li>epoch {epoch} of chain {}</li>", escape(chain));
    }
    out.push_str("</ul></section>");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels::{Label, Labels};
    use crate::plot::tests::{check_tags, counter};
    use crate::report::HeldBack;
    use penrose_core::release::{ReportsPerContributor, Threshold};

    fn report() -> Report {
        let mut merged = counter(7, &[(3, 40), (50, 2)]);
        merged.merged_from = vec![9];
        Report {
            period: None,
            threshold: Threshold::DEFAULT,
            reports_per_contributor: ReportsPerContributor::DEFAULT,
            bundles: 2,
            epochs: 3,
            withheld_sums: 4,
            withheld_reports: 55,
            decrypted: vec![merged, counter(8, &[(0, 1)])],
            held_back: vec![HeldBack {
                class: 11,
                arch: "sm_90".into(),
                counter: 5,
                reports: 100,
                contributors_at_least: 5,
            }],
            quarantined: Vec::new(),
            awaiting_auditor: Vec::new(),
            skipped_epochs: Vec::new(),
            bound_enforced_by_tokens: false,
            epochs_without_tokens: 3,
            labels: Default::default(),
        }
    }

    #[test]
    fn the_page_escapes_labels_and_draws_only_decrypted_sums() {
        let mut r = report();
        let mut labels = Labels::default();
        labels.set(
            7,
            Some(Label::new("<script>alert('x')</script> & co").unwrap()),
        );
        labels.set(9, Some(Label::new("old & merged").unwrap()));
        labels.set(11, Some(Label::new("<b>small</b>").unwrap()));
        r.apply_labels(&labels);
        let page = render(&r);
        assert!(page.starts_with("<!DOCTYPE html>"));
        let body = page.trim_start_matches("<!DOCTYPE html>\n");
        let tags = check_tags(body).unwrap();
        assert!(
            !tags
                .iter()
                .any(|t| t == "script" || t == "img" || t == "link")
        );
        assert!(!page.contains("<script"), "the label is escaped");
        assert!(page.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; co"));
        assert!(
            page.contains("old &amp; merged"),
            "merged-from classes with their labels"
        );
        assert!(
            page.contains("&lt;b&gt;small&lt;/b&gt;"),
            "held back, with its label"
        );
        // Overview and one histogram per decrypted (class, counter); bars only for non-empty
        // bins (2 + 1), plus the overview's one bar per class (2).
        assert_eq!(tags.iter().filter(|t| *t == "svg").count(), 3);
        assert_eq!(tags.iter().filter(|t| *t == "rect").count(), 5);
        // The held-back class is listed, never drawn.
        assert!(!page.contains("id=\"class-11\""));
        assert!(page.contains("Withheld"));
        assert!(page.contains("withheld 4 sums (55 reports)"));
        assert!(page.contains("threshold k</dt><dd>10 contributors"));
        assert!(page.contains("contributor bound enforced by admission tokens: no"));
        assert!(page.contains("default-src 'none'"));
    }

    /// A joint view is drawn as a heat map with its quadrant table (shares of samples and of
    /// kernel time), not as a histogram, and without the per-counter statistics it has not.
    #[test]
    fn a_joint_view_is_a_heat_map_with_its_quadrants() {
        let mut r = report();
        r.decrypted.push(crate::plot::tests::joint_counter(8));
        let page = render(&r);
        let tags = check_tags(page.trim_start_matches("<!DOCTYPE html>\n")).unwrap();
        assert_eq!(tags.iter().filter(|t| *t == "svg").count(), 4);
        assert_eq!(page.matches(r#"class="cell""#).count(), 2);
        assert_eq!(page.matches(r#"<table class="quadrants">"#).count(), 1);
        assert!(
            page.contains("kernel_duration &gt;= 10.0 µs and achieved_occupancy &lt; 50.0%"),
            "{page}"
        );
        assert!(page.contains("share of kernel time (bounds)"));
        let joint = page.split("counter-10\"").nth(1).unwrap();
        let joint = joint.split("</div>").next().unwrap();
        assert!(!joint.contains("<th>p50</th>"), "{joint}");
    }

    #[test]
    fn an_empty_report_is_a_page_too() {
        let mut r = report();
        r.decrypted.clear();
        r.held_back.clear();
        let page = render(&r);
        check_tags(page.trim_start_matches("<!DOCTYPE html>\n")).unwrap();
        assert!(page.contains("no class reached the threshold"));
    }
}
