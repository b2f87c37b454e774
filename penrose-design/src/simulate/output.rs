//! The simulator's outputs: a text table and an SVG plot of the coverage curves.
//!
//! The plot is written by hand (about a hundred lines of SVG elements): one line chart needs
//! no plotting library, and a hand-written one adds no dependency, licence or duplicate
//! version to the design server and gives the same bytes for the same run.

use std::fmt::Write as _;

use super::fleet::Mix;
use super::params::Rule;
use super::{Quantiles, ScenarioResult, Simulation};

/// Formats hours, or `>H` when the run ended first.
fn hours(h: Option<f64>, horizon: f64) -> String {
    match h {
        Some(h) => format!("{h:.1}"),
        None => format!(">{horizon:.0}"),
    }
}

fn pair(q: &Quantiles, horizon: f64) -> String {
    format!(
        "{:>6} {:>6}",
        hours(q.p97_5, horizon),
        hours(q.p100, horizon)
    )
}

/// The text table: per scenario, hours until 97.5% and 100% of applications are covered under
/// each definition.
pub fn table(sim: &Simulation) -> String {
    let p = &sim.params;
    let mut out = String::new();
    describe(&mut out, sim);
    let _ = writeln!(
        out,
        "\nHours until 97.5% / 100% of the applications the fleet runs are covered \
         (>{:.0}: not within the run)",
        p.hours
    );
    let _ = writeln!(
        out,
        "{:>5} {:>5}  {:<13} {:>7}  {:>13}  {:>13}  {:>13}  {:>13}  {:>7}  {:>7}  {:>7}",
        "apps",
        "run",
        "mix",
        "budget",
        "released",
        "on >=k GPUs",
        "reported",
        "sampled",
        "on <k",
        "samples",
        "reports"
    );
    let _ = writeln!(
        out,
        "{:>5} {:>5}  {:<13} {:>7}  {:>6} {:>6}  {:>6} {:>6}  {:>6} {:>6}  {:>6} {:>6}  {:>7}  {:>7}  {:>7}",
        "",
        "",
        "",
        "",
        "97.5%",
        "100%",
        "97.5%",
        "100%",
        "97.5%",
        "100%",
        "97.5%",
        "100%",
        "GPUs",
        "/GPU-h",
        "/GPU-h"
    );
    for s in &sim.scenarios {
        let _ = writeln!(
            out,
            "{:>5} {:>5}  {:<13} {:>6}%  {}  {}  {}  {}  {:>7}  {:>7.2}  {:>7.2}",
            s.apps,
            s.apps_present,
            s.mix.name(),
            s.budget_percent,
            pair(&s.released, p.hours),
            pair(&s.released_on_k_gpus, p.hours),
            pair(&s.reported, p.hours),
            pair(&s.sampled, p.hours),
            s.apps_under_k_gpus,
            s.samples_per_gpu_hour,
            s.reports_per_gpu_hour
        );
    }
    latency_table(&mut out, sim);
    out
}

/// The run's parameters, as the table's first lines.
fn describe(out: &mut String, sim: &Simulation) {
    let p = &sim.params;
    let _ = writeln!(
        out,
        "Fleet coverage: {} GPUs ({}% busy), {} h simulated, seed {}, {} thread(s), {:.1} s",
        p.gpus,
        p.load * 100.0,
        p.hours,
        p.seed,
        sim.threads,
        sim.seconds
    );
    let _ = writeln!(
        out,
        "popularity Zipf s = {}; sampler {}, S = {}, O = {} s; probe {} us per launch, L = {}, \
         window <= {} s, gap {}..{} s, probed process {} CPU",
        p.zipf,
        p.sampler.name(),
        p.sample_period,
        p.reoffset_seconds,
        p.probe_cost_us,
        p.window_launches,
        p.max_window_seconds,
        p.min_gap_seconds,
        p.max_gap_seconds,
        p.process_cpu
    );
    let rule = match p.rule {
        Rule::Daily => format!(
            "daily rule: T = {} reports per (counter, day), epoch {} h",
            p.reports_per_day, p.epoch_hours
        ),
        Rule::Hourly => format!(
            "hourly rule: q = {} reports per (counter, hour), released when the bound reaches k",
            p.reports_per_hour
        ),
    };
    let _ = writeln!(
        out,
        "{} counter groups, {} s each; seal at {} samples or {} s; upload delay <= {} s; \
         k = {} contributors; {rule}",
        p.groups,
        p.group_seconds,
        p.seal_samples,
        p.seal_max_age_seconds,
        p.upload_delay_seconds,
        p.threshold,
    );
    if p.steer != super::steer::Policy::None {
        let _ = writeln!(
            out,
            "steered by the ack: policy {}, f = {}, seal age {} s while short; server counts \
             every {} s",
            p.steer, p.steer_factor, p.steer_seal_age_seconds, p.steer_step_seconds
        );
    }
}

/// Under the hourly rule: how long a report waits from its arrival to its sum's release.
fn latency_table(out: &mut String, sim: &Simulation) {
    if sim.params.rule != Rule::Hourly {
        return;
    }
    let _ = writeln!(
        out,
        "\nFrom a report's arrival to its sum's release, applications on >= {} GPUs: the median \
         and the largest of each application's median wait (minutes)",
        super::run::LATENCY_GPUS
    );
    let _ = writeln!(
        out,
        "{:>5}  {:<13} {:>7}  {:>6}  {:>10}  {:>9}  {:>7}  {:>7}",
        "apps", "mix", "budget", "on 30+", "reports", "released", "median", "largest"
    );
    let minutes = |h: Option<f64>| h.map_or_else(|| "-".to_owned(), |h| format!("{:.1}", h * 60.0));
    for s in &sim.scenarios {
        let Some(l) = s.latency else { continue };
        let _ = writeln!(
            out,
            "{:>5}  {:<13} {:>6}%  {:>6}  {:>10}  {:>8.1}%  {:>7}  {:>7}",
            s.apps,
            s.mix.name(),
            s.budget_percent,
            l.apps,
            l.reports,
            l.released_share * 100.0,
            minutes(l.median),
            minutes(l.worst)
        );
    }
}

const COLOURS: [&str; 3] = ["#1f77b4", "#d62728", "#2ca02c"];
const DASHES: [&str; 4] = ["", "8 4", "2 3", "12 3 2 3"];

/// A tick step of at least `span / 8`: 1, 2, 4 or 5 times a power of ten.
fn tick_step(span: f64) -> f64 {
    let raw = (span / 8.0).max(f64::MIN_POSITIVE);
    let power = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 4.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * power)
}

/// Where the coverage plot lies in its 820 x 480 drawing, and where an hour and a share of
/// applications fall on it.
struct Frame {
    /// The simulated hours the x axis spans.
    horizon: f64,
}

impl Frame {
    const WIDTH: f64 = 820.0;
    const HEIGHT: f64 = 480.0;
    const LEFT: f64 = 64.0;
    const RIGHT: f64 = 230.0;
    const TOP: f64 = 48.0;
    const BOTTOM: f64 = 52.0;
    /// The plot's width and height.
    const PW: f64 = Self::WIDTH - Self::LEFT - Self::RIGHT;
    const PH: f64 = Self::HEIGHT - Self::TOP - Self::BOTTOM;

    fn x(&self, h: f64) -> f64 {
        Self::LEFT + Self::PW * h / self.horizon
    }

    fn y(&self, share: f64) -> f64 {
        Self::TOP + Self::PH * (1.0 - share)
    }
}

/// The SVG plot: the share of applications released against simulated hours, one line per
/// scenario (colour: mix; dashes: application count and budget), and the 97.5% line.
pub fn svg(sim: &Simulation) -> String {
    let frame = Frame {
        horizon: sim.params.hours,
    };
    let mut o = String::new();
    svg_header(&mut o, sim);
    svg_hour_grid(&mut o, &frame);
    svg_share_grid(&mut o, &frame);
    svg_axes(&mut o, &frame);
    svg_scenarios(&mut o, &frame, sim);
    o.push_str("</svg>\n");
    o
}

/// The `<svg>` element's opening, the white background and the title.
fn svg_header(o: &mut String, sim: &Simulation) {
    let (width, height) = (Frame::WIDTH, Frame::HEIGHT);
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        o,
        r##"<rect width="{width}" height="{height}" fill="#ffffff"/>"##
    );
    let _ = writeln!(
        o,
        r#"<text x="{}" y="24" font-size="14" text-anchor="middle">Applications released ({} GPUs, k = {} contributors per counter group, epoch {} h)</text>"#,
        Frame::LEFT + Frame::PW / 2.0,
        sim.params.gpus,
        sim.params.threshold,
        sim.params.epoch_hours
    );
}

/// A vertical grid line and its label at every round number of hours.
fn svg_hour_grid(o: &mut String, frame: &Frame) {
    let step = tick_step(frame.horizon);
    for i in 0u32.. {
        let h = f64::from(i) * step;
        if h > frame.horizon + 1e-9 {
            break;
        }
        let label = (h * 1000.0).round() / 1000.0;
        let _ = writeln!(
            o,
            r##"<line x1="{0:.1}" y1="{1:.1}" x2="{0:.1}" y2="{2:.1}" stroke="#e0e0e0"/><text x="{0:.1}" y="{3:.1}" text-anchor="middle">{4}</text>"##,
            frame.x(h),
            Frame::TOP,
            Frame::TOP + Frame::PH,
            Frame::TOP + Frame::PH + 18.0,
            label
        );
    }
}

/// A horizontal grid line and its label every 20% of applications.
fn svg_share_grid(o: &mut String, frame: &Frame) {
    for pct in (0..=100).step_by(20) {
        let share = f64::from(pct) / 100.0;
        let _ = writeln!(
            o,
            r##"<line x1="{0:.1}" y1="{1:.1}" x2="{2:.1}" y2="{1:.1}" stroke="#e0e0e0"/><text x="{3:.1}" y="{4:.1}" text-anchor="end">{pct}%</text>"##,
            Frame::LEFT,
            frame.y(share),
            Frame::LEFT + Frame::PW,
            Frame::LEFT - 6.0,
            frame.y(share) + 4.0
        );
    }
}

/// The plot's border, the axes' names and the dashed 97.5% line.
fn svg_axes(o: &mut String, frame: &Frame) {
    let (left, top, pw, ph) = (Frame::LEFT, Frame::TOP, Frame::PW, Frame::PH);
    let _ = writeln!(
        o,
        r##"<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#000000"/>"##
    );
    let _ = writeln!(
        o,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">simulated hours</text>"#,
        left + pw / 2.0,
        Frame::HEIGHT - 12.0
    );
    let _ = writeln!(
        o,
        r#"<text x="16" y="{0:.1}" text-anchor="middle" transform="rotate(-90 16 {0:.1})">applications covered</text>"#,
        top + ph / 2.0
    );
    let _ = writeln!(
        o,
        r##"<line x1="{left}" y1="{0:.1}" x2="{1:.1}" y2="{0:.1}" stroke="#555555" stroke-dasharray="3 3"/><text x="{2:.1}" y="{3:.1}" fill="#555555">97.5%</text>"##,
        frame.y(0.975),
        left + pw,
        left + 4.0,
        frame.y(0.975) - 4.0
    );
}

/// How a scenario's line is drawn: its mix's colour, and the dashes of its (application
/// count, budget), as an SVG attribute (empty for a solid line).
struct LineStyle {
    colour: &'static str,
    dash_attr: String,
}

/// One coverage line per scenario, with its entry in the legend.
fn svg_scenarios(o: &mut String, frame: &Frame, sim: &Simulation) {
    // The (application count, budget bits) of each dash style given out so far.
    let mut styles: Vec<(u32, u64)> = Vec::new();
    for (i, s) in sim.scenarios.iter().enumerate() {
        let style = line_style(&mut styles, s);
        let points: Vec<String> = s
            .curve
            .iter()
            .map(|&(h, share)| format!("{:.1},{:.1}", frame.x(h), frame.y(share)))
            .collect();
        let _ = writeln!(
            o,
            r#"<polyline class="coverage" fill="none" stroke="{}" stroke-width="2"{} points="{}"/>"#,
            style.colour,
            style.dash_attr,
            points.join(" ")
        );
        let budgets = sim.params.budgets_percent.len() > 1;
        svg_legend_entry(o, i, s, &style, budgets);
    }
}

/// A scenario's line style: the colour of its mix, and the dashes of its (application count,
/// budget), given out in order of first appearance in `styles`.
fn line_style(styles: &mut Vec<(u32, u64)>, s: &ScenarioResult) -> LineStyle {
    let colour = COLOURS[match s.mix {
        Mix::Uniform => 0,
        Mix::SmallKernel => 1,
        Mix::LargeKernel => 2,
    }];
    let key = (s.apps, s.budget_percent.to_bits());
    let style = styles.iter().position(|k| *k == key).unwrap_or_else(|| {
        styles.push(key);
        styles.len() - 1
    });
    let dash = DASHES[style % DASHES.len()];
    let dash_attr = if dash.is_empty() {
        String::new()
    } else {
        format!(r#" stroke-dasharray="{dash}""#)
    };
    LineStyle { colour, dash_attr }
}

/// The legend's `i`th entry: a short line in the scenario's style and its name (with its
/// budget when the run compared `budgets`).
fn svg_legend_entry(
    o: &mut String,
    i: usize,
    s: &ScenarioResult,
    style: &LineStyle,
    budgets: bool,
) {
    let ly = Frame::TOP + 10.0 + 18.0 * i as f64;
    let lx = Frame::LEFT + Frame::PW + 16.0;
    let label = if budgets {
        format!("{}, A = {}, {}%", s.mix.name(), s.apps, s.budget_percent)
    } else {
        format!("{}, A = {}", s.mix.name(), s.apps)
    };
    let _ = writeln!(
        o,
        r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{}" stroke-width="2"{}/><text x="{:.1}" y="{:.1}">{label}</text>"#,
        lx + 28.0,
        style.colour,
        style.dash_attr,
        lx + 34.0,
        ly + 4.0
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round() {
        for (span, step) in [
            (24.0, 4.0),
            (48.0, 10.0),
            (8.0, 1.0),
            (1.0, 0.2),
            (72.0, 10.0),
        ] {
            assert!((tick_step(span) - step).abs() < 1e-12, "{span}");
        }
    }
}
