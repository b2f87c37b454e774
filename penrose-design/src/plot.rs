//! Plots as SVG, written by hand: a histogram per decrypted (class, counter), a heat map per
//! decrypted joint view (two counters of one launch in a 16 x 8 grid, split into quadrants),
//! and a fleet overview of classes by reports.
//!
//! Only what [`crate::report`] decrypted is drawn: a [`CounterReport`] exists only for
//! released sums above the threshold, and a bin is drawn only when its sum is non-zero.
//! Sums under the threshold have no bins to draw; the HTML page lists them as withheld.
//!
//! Every text (labels are user input) goes through [`escape`]; numbers are written by
//! [`crate::scale`].
//! The SVG needs no script and no external resource, so it can be inlined into an HTML page or
//! saved on its own (`--svg DIR`).

use std::fmt::Write as _;

use penrose_core::counters::{BIN_COUNT, Bin, Binning};

use crate::joint::JointSummary;
use crate::report::{CounterReport, Report};
use crate::scale::{binning, human};

/// Escapes text for XML and HTML content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Where a text is anchored.
#[derive(Clone, Copy, Debug)]
pub enum Anchor {
    /// At its start.
    Start,
    /// At its middle.
    Middle,
    /// At its end.
    End,
}

impl Anchor {
    fn as_str(self) -> &'static str {
        match self {
            Anchor::Start => "start",
            Anchor::Middle => "middle",
            Anchor::End => "end",
        }
    }
}

/// An SVG document being drawn; every text added is escaped.
#[derive(Debug)]
pub struct Svg {
    width: u32,
    height: u32,
    title: String,
    body: String,
}

/// The bars' colour.
const BAR: &str = "#3b6ea8";
/// Axes and text.
const INK: &str = "#222";
/// Grid lines.
const GRID: &str = "#ccc";

impl Svg {
    /// An empty drawing of `width` x `height` pixels, titled `title` (its `<title>`).
    pub fn new(width: u32, height: u32, title: &str) -> Self {
        Self {
            width,
            height,
            title: title.to_string(),
            body: String::new(),
        }
    }

    /// A filled rectangle, with a tooltip (`<title>`) if given.
    pub fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, fill: &'static str, tip: Option<&str>) {
        self.shape("bar", x, y, w, h, &Colour::Named(fill), tip);
    }

    /// A rectangle of class `class` (`bar`, `cell`), filled with `fill`.
    #[allow(clippy::too_many_arguments)]
    fn shape(
        &mut self,
        class: &str,
        x: f64,
        y: f64,
        w: f64,
        h: f64,
        fill: &Colour,
        tip: Option<&str>,
    ) {
        let _ = write!(
            self.body,
            r#"<rect class="{class}" x="{x:.2}" y="{y:.2}" width="{w:.2}" height="{h:.2}" fill="{fill}">"#
        );
        if let Some(tip) = tip {
            let _ = write!(self.body, "<title>{}</title>", escape(tip));
        }
        self.body.push_str("</rect>");
    }

    /// A line.
    pub fn line(&mut self, x1: f64, y1: f64, x2: f64, y2: f64, stroke: &'static str) {
        let _ = write!(
            self.body,
            r#"<line x1="{x1:.2}" y1="{y1:.2}" x2="{x2:.2}" y2="{y2:.2}" stroke="{stroke}" stroke-width="1"/>"#
        );
    }

    /// A dashed line two pixels wide (a split).
    fn dashed(&mut self, x1: f64, y1: f64, x2: f64, y2: f64, stroke: &'static str) {
        let _ = write!(
            self.body,
            r#"<line class="split" x1="{x1:.2}" y1="{y1:.2}" x2="{x2:.2}" y2="{y2:.2}" stroke="{stroke}" stroke-width="2" stroke-dasharray="6 3"/>"#
        );
    }

    /// A text at (x, y) (its baseline), `size` pixels high.
    pub fn text(&mut self, x: f64, y: f64, anchor: Anchor, size: u32, text: &str) {
        let _ = write!(
            self.body,
            r#"<text x="{x:.2}" y="{y:.2}" text-anchor="{}" font-size="{size}" fill="{INK}">{}</text>"#,
            anchor.as_str(),
            escape(text)
        );
    }

    /// The SVG element, to inline in HTML or save as a file.
    pub fn finish(self) -> String {
        format!(
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" role="img"><title>{t}</title>{b}</svg>"#,
            w = self.width,
            h = self.height,
            t = escape(&self.title),
            b = self.body
        )
    }
}

/// A fill colour: a named constant or one computed for a heat map cell.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Colour {
    Named(&'static str),
    Rgb(u8, u8, u8),
}

impl std::fmt::Display for Colour {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Colour::Named(name) => f.write_str(name),
            Colour::Rgb(r, g, b) => write!(f, "#{r:02x}{g:02x}{b:02x}"),
        }
    }
}

/// The heat map's colour of a cell holding `share` (0 to 1) of the fullest cell's samples:
/// from a pale to a dark blue, on a square-root scale so that cells of a few samples still
/// show beside a dominant one.
fn heat(share: f64) -> Colour {
    let t = share.clamp(0.0, 1.0).sqrt();
    let mix = |a: u8, b: u8| (f64::from(a) + (f64::from(b) - f64::from(a)) * t).round() as u8;
    Colour::Rgb(mix(0xde, 0x08), mix(0xeb, 0x30), mix(0xf7, 0x6b))
}

/// The splits' colour.
const SPLIT: &str = "#c0392b";

/// A class as a plot's title names it: `class 7 (label)`.
fn class_name(class: u32, label: Option<&str>) -> String {
    match label {
        Some(l) => format!("class {class} ({l})"),
        None => format!("class {class}"),
    }
}

/// Where a heat map's grid lies in its 640 x 330 drawing, and the size of its cells.
struct Grid {
    /// The grid's width.
    pw: f64,
    /// The grid's bottom edge.
    base: f64,
    /// Cells across and up.
    nx: usize,
    ny: usize,
    /// A cell's width and height.
    cw: f64,
    ch: f64,
}

impl Grid {
    const W: f64 = 640.0;
    const H: f64 = 330.0;
    const LEFT: f64 = 78.0;
    const RIGHT: f64 = 24.0;
    const TOP: f64 = 30.0;
    const BOTTOM: f64 = 56.0;

    fn of(j: &JointSummary) -> Self {
        let (pw, ph) = (
            Self::W - Self::LEFT - Self::RIGHT,
            Self::H - Self::TOP - Self::BOTTOM,
        );
        let (nx, ny) = (j.x.edges.len() - 1, j.y.edges.len() - 1);
        Self {
            pw,
            base: Self::TOP + ph,
            nx,
            ny,
            cw: pw / nx as f64,
            ch: ph / ny as f64,
        }
    }

    /// The left edge of column `i`.
    fn cell_x(&self, i: usize) -> f64 {
        Self::LEFT + i as f64 * self.cw
    }

    /// The top edge of row `i`, row 0 at the bottom.
    fn cell_y(&self, i: usize) -> f64 {
        self.base - (i + 1) as f64 * self.ch
    }

    /// The line under row `i` (the grid's bottom for 0).
    fn row_edge(&self, i: usize) -> f64 {
        self.base - i as f64 * self.ch
    }
}

/// The heat map of one decrypted joint view: its 16 x 8 cells coloured by samples (empty cells
/// left blank), each with a tooltip of its ranges and count, the split as two dashed lines and
/// each quadrant's share of samples written in its corner.
pub fn heatmap(c: &CounterReport, j: &JointSummary, label: Option<&str>) -> String {
    let grid = Grid::of(j);
    let who = class_name(c.class, label);
    // The axes name the two counters; the title stays short enough for the plot's width.
    let title = format!("{who}, {}: {}, {} samples", c.arch, c.name, c.samples);
    let mut svg = Svg::new(Grid::W as u32, Grid::H as u32, &title);
    svg.text(Grid::LEFT, 18.0, Anchor::Start, 13, &title);
    heat_cells(&mut svg, &grid, c, j);
    heat_axes(&mut svg, &grid, j);
    heat_split(&mut svg, &grid, j);
    svg.finish()
}

/// The non-empty cells, coloured by their share of the fullest one.
fn heat_cells(svg: &mut Svg, grid: &Grid, c: &CounterReport, j: &JointSummary) {
    let max = c.bins.iter().copied().max().unwrap_or(0);
    let total: u64 = c.bins.iter().sum();
    if max == 0 {
        return;
    }
    for (i, &count) in c.bins.iter().enumerate() {
        if count == 0 {
            continue;
        }
        let (cx, cy) = (i % grid.nx, i / grid.nx);
        let tip = format!(
            "{} [{}, {}), {} [{}, {}): {count} samples ({:.1}%)",
            j.x.counter,
            human(j.x.edges[cx], &j.x.unit),
            human(j.x.edges[cx + 1], &j.x.unit),
            j.y.counter,
            human(j.y.edges[cy], &j.y.unit),
            human(j.y.edges[cy + 1], &j.y.unit),
            count as f64 / total.max(1) as f64 * 100.0
        );
        svg.shape(
            "cell",
            grid.cell_x(cx),
            grid.cell_y(cy),
            grid.cw,
            grid.ch,
            &heat(count as f64 / max as f64),
            Some(&tip),
        );
    }
}

/// The axes, with the edges every few cells, and the captions naming the two counters.
fn heat_axes(svg: &mut Svg, grid: &Grid, j: &JointSummary) {
    let (left, top, base, pw) = (Grid::LEFT, Grid::TOP, grid.base, grid.pw);
    svg.line(left, base, left + pw, base, INK);
    svg.line(left, top, left, base, INK);
    svg.line(left, top, left + pw, top, GRID);
    svg.line(left + pw, top, left + pw, base, GRID);
    for i in (0..=grid.nx).step_by(4) {
        let x = grid.cell_x(i);
        svg.line(x, base, x, base + 4.0, INK);
        svg.text(
            x,
            base + 16.0,
            Anchor::Middle,
            11,
            &human(j.x.edges[i], &j.x.unit),
        );
    }
    for i in (0..=grid.ny).step_by(2) {
        let y = grid.row_edge(i);
        svg.line(left - 4.0, y, left, y, INK);
        svg.text(
            left - 6.0,
            y + 4.0,
            Anchor::End,
            11,
            &human(j.y.edges[i], &j.y.unit),
        );
    }
    svg.text(
        left + pw / 2.0,
        Grid::H - 24.0,
        Anchor::Middle,
        12,
        &format!("x: {} ({} cells)", j.x.counter, grid.nx),
    );
    svg.text(
        left + pw / 2.0,
        Grid::H - 8.0,
        Anchor::Middle,
        12,
        &format!(
            "y: {} ({} cells); colour: samples per cell; dashed: the split",
            j.y.counter, grid.ny
        ),
    );
}

/// The split as dashed lines (where it falls inside the grid) and each quadrant's share of
/// samples in its corner.
fn heat_split(svg: &mut Svg, grid: &Grid, j: &JointSummary) {
    let (left, top, base, pw) = (Grid::LEFT, Grid::TOP, grid.base, grid.pw);
    let (sx, sy) = (grid.cell_x(j.x.split_cell), grid.row_edge(j.y.split_cell));
    if j.x.split_cell > 0 && j.x.split_cell < grid.nx {
        svg.dashed(sx, top, sx, base, SPLIT);
    }
    if j.y.split_cell > 0 && j.y.split_cell < grid.ny {
        svg.dashed(left, sy, left + pw, sy, SPLIT);
    }
    for q in &j.quadrants {
        let (x, anchor) = if q.x_high {
            (left + pw - 4.0, Anchor::End)
        } else {
            (left + 4.0, Anchor::Start)
        };
        let y = if q.y_high { top + 14.0 } else { base - 6.0 };
        svg.text(x, y, anchor, 12, &format!("{:.1}%", q.share * 100.0));
    }
}

fn bin(i: usize) -> Bin {
    Bin::new(i).unwrap_or(Bin::LAST)
}

/// Where a histogram's bars lie in its 640 x 230 drawing.
struct Bars {
    /// The plot's width and height.
    pw: f64,
    ph: f64,
    /// A bar's width.
    bw: f64,
    /// The count axis's zero line.
    base: f64,
}

impl Bars {
    const W: f64 = 640.0;
    const H: f64 = 230.0;
    const LEFT: f64 = 64.0;
    const RIGHT: f64 = 16.0;
    const TOP: f64 = 28.0;
    const BOTTOM: f64 = 48.0;

    fn new() -> Self {
        let (pw, ph) = (
            Self::W - Self::LEFT - Self::RIGHT,
            Self::H - Self::TOP - Self::BOTTOM,
        );
        Self {
            pw,
            ph,
            bw: pw / BIN_COUNT as f64,
            base: Self::TOP + ph,
        }
    }
}

/// The histogram of one decrypted (class, counter): its 128 bins on the catalogue's edges,
/// one bar per non-empty bin (its tooltip the bin's range and count).
pub fn histogram(c: &CounterReport, label: Option<&str>) -> String {
    let bars = Bars::new();
    let who = class_name(c.class, label);
    let title = format!(
        "{who}, {}: {} histogram, {} samples",
        c.arch, c.name, c.samples
    );
    let mut svg = Svg::new(Bars::W as u32, Bars::H as u32, &title);
    svg.text(Bars::LEFT, 18.0, Anchor::Start, 13, &title);
    let max = c.bins.iter().copied().max().unwrap_or(0);
    let binning = binning(c);
    bar_axes(&mut svg, &bars, c, binning, max);
    bar_caption(&mut svg, &bars, c, binning);
    if max > 0 {
        draw_bars(&mut svg, &bars, c, binning, max);
    }
    svg.finish()
}

/// A bin's lower edge in the counter's unit (the last bin's upper edge for `BIN_COUNT`), or
/// its number for a counter the catalogue does not know.
fn bin_edge(binning: Option<Binning>, unit: &str, i: usize) -> String {
    match binning {
        // The upper edge of the last bin for i = BIN_COUNT.
        Some(b) if i >= BIN_COUNT => human(b.edges(Bin::LAST).1, unit),
        Some(b) => human(b.edges(bin(i)).0, unit),
        None => format!("bin {i}"),
    }
}

/// Axes, the top grid line, the count scale and the bins' edges every quarter.
fn bar_axes(svg: &mut Svg, bars: &Bars, c: &CounterReport, binning: Option<Binning>, max: u64) {
    let (left, top, base, pw) = (Bars::LEFT, Bars::TOP, bars.base, bars.pw);
    svg.line(left, base, left + pw, base, INK);
    svg.line(left, top, left, base, INK);
    svg.line(left, top, left + pw, top, GRID);
    svg.text(left - 6.0, base + 4.0, Anchor::End, 11, "0");
    svg.text(
        left - 6.0,
        top + 4.0,
        Anchor::End,
        11,
        &human(max as f64, ""),
    );
    for i in (0..=BIN_COUNT).step_by(BIN_COUNT / 4) {
        let x = left + i as f64 * bars.bw;
        svg.line(x, base, x, base + 4.0, INK);
        svg.text(
            x,
            base + 16.0,
            Anchor::Middle,
            11,
            &bin_edge(binning, &c.unit, i),
        );
    }
}

/// The caption under the axis: the counter, its unit and its bins' scale.
fn bar_caption(svg: &mut Svg, bars: &Bars, c: &CounterReport, binning: Option<Binning>) {
    let scale = match binning {
        Some(Binning::Log { .. }) => "logarithmic bins",
        Some(Binning::Linear { .. }) => "linear bins",
        None => "bins of a counter the catalogue does not know",
    };
    let unit = if c.unit.is_empty() {
        String::new()
    } else {
        format!(" ({})", c.unit)
    };
    svg.text(
        Bars::LEFT + bars.pw / 2.0,
        Bars::H - 8.0,
        Anchor::Middle,
        12,
        &format!(
            "{}{unit}, {BIN_COUNT} {scale}; bars: samples per bin",
            c.name
        ),
    );
}

/// One bar per non-empty bin, scaled to the fullest (`max`, not zero), at least a pixel high.
fn draw_bars(svg: &mut Svg, bars: &Bars, c: &CounterReport, binning: Option<Binning>, max: u64) {
    for (i, &count) in c.bins.iter().enumerate() {
        if count == 0 {
            continue;
        }
        let h = (count as f64 / max as f64 * bars.ph).max(1.0);
        let tip = match binning {
            Some(b) => {
                let (lo, hi) = b.edges(bin(i));
                format!(
                    "bin {i}: [{}, {}): {count} samples",
                    human(lo, &c.unit),
                    human(hi, &c.unit)
                )
            }
            None => format!("bin {i}: {count} samples"),
        };
        svg.rect(
            Bars::LEFT + i as f64 * bars.bw,
            bars.base - h,
            bars.bw,
            h,
            BAR,
            Some(&tip),
        );
    }
}

/// The most classes the overview draws; the rest are in the page's tables.
pub const OVERVIEW_CLASSES: usize = 40;

/// Reports per class over its decrypted counters, most first (ties by class id).
pub fn classes_by_reports(report: &Report) -> Vec<(u32, u64)> {
    let mut per: Vec<(u32, u64)> = Vec::new();
    for c in &report.decrypted {
        match per.iter_mut().find(|(k, _)| *k == c.class) {
            Some((_, r)) => *r += c.reports,
            None => per.push((c.class, c.reports)),
        }
    }
    per.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    per
}

/// The fleet overview: one horizontal bar per decrypted class, its reports (all counters
/// added), most first; at most [`OVERVIEW_CLASSES`].
pub fn overview(report: &Report) -> String {
    const W: f64 = 640.0;
    const LEFT: f64 = 210.0;
    const RIGHT: f64 = 70.0;
    const TOP: f64 = 30.0;
    const ROW: f64 = 20.0;
    let per = classes_by_reports(report);
    let shown = &per[..per.len().min(OVERVIEW_CLASSES)];
    let h = TOP + ROW * shown.len().max(1) as f64 + 28.0;
    let title = "Fleet overview: decrypted reports per class (all counters)";
    let mut svg = Svg::new(W as u32, h as u32, title);
    svg.text(8.0, 18.0, Anchor::Start, 13, title);
    if shown.is_empty() {
        svg.text(
            8.0,
            TOP + 14.0,
            Anchor::Start,
            12,
            "no class reached the threshold",
        );
        return svg.finish();
    }
    let max = shown.first().map_or(1, |(_, r)| (*r).max(1)) as f64;
    let pw = W - LEFT - RIGHT;
    for (row, (class, reports)) in shown.iter().enumerate() {
        let y = TOP + row as f64 * ROW;
        let name = match report.labels.get(class) {
            Some(l) => format!("class {class} {}", shorten(l.as_str(), 22)),
            None => format!("class {class}"),
        };
        svg.text(LEFT - 8.0, y + 14.0, Anchor::End, 12, &name);
        let w = (*reports as f64 / max * pw).max(1.0);
        svg.rect(
            LEFT,
            y + 3.0,
            w,
            ROW - 6.0,
            BAR,
            Some(&format!("class {class}: {reports} reports")),
        );
        svg.text(
            LEFT + w + 4.0,
            y + 14.0,
            Anchor::Start,
            11,
            &reports.to_string(),
        );
    }
    let base = TOP + ROW * shown.len() as f64;
    svg.line(LEFT, TOP, LEFT, base, INK);
    if per.len() > shown.len() {
        svg.text(
            LEFT,
            base + 18.0,
            Anchor::Start,
            11,
            &format!(
                "{} more classes in the tables below",
                per.len() - shown.len()
            ),
        );
    }
    svg.finish()
}

/// `text` cut to `max` characters, with an ellipsis when cut.
fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut s: String = text.chars().take(max.saturating_sub(1)).collect();
    s.push('…');
    s
}

#[cfg(test)]
pub(crate) mod tests {
    use penrose_core::counters::Catalogue;

    use super::*;

    /// Checks that `xml` is well formed as far as tags go: every element closed in order,
    /// attribute values quoted, no stray `<` or `&`. Returns the element names opened.
    pub(crate) fn check_tags(xml: &str) -> Result<Vec<String>, String> {
        let mut stack: Vec<String> = Vec::new();
        let mut opened = Vec::new();
        let mut rest = xml;
        while let Some(at) = rest.find(['<', '&']) {
            let (text, tail) = rest.split_at(at);
            if text.contains('>') {
                return Err(format!("stray '>' in {text:?}"));
            }
            if let Some(entity) = tail.strip_prefix('&') {
                let end = entity.find(';').ok_or("unterminated entity")?;
                let name = &entity[..end];
                let known = ["amp", "lt", "gt", "quot", "#39"].contains(&name);
                if !known {
                    return Err(format!("unknown entity &{name};"));
                }
                rest = &entity[end + 1..];
                continue;
            }
            let end = tail.find('>').ok_or("unterminated tag")?;
            let tag = &tail[1..end];
            rest = &tail[end + 1..];
            if tag.starts_with('!') || tag.starts_with('?') {
                continue;
            }
            if tag.matches('"').count() % 2 != 0 || tag.contains('<') {
                return Err(format!("malformed tag <{tag}>"));
            }
            if let Some(name) = tag.strip_prefix('/') {
                match stack.pop() {
                    Some(open) if open == name => {}
                    other => return Err(format!("</{name}> closes {other:?}")),
                }
                continue;
            }
            let name: String = tag
                .chars()
                .take_while(|c| !c.is_whitespace() && *c != '/')
                .collect();
            opened.push(name.clone());
            if !tag.ends_with('/') {
                stack.push(name);
            }
        }
        if rest.contains('>') {
            return Err("stray '>' at the end".into());
        }
        match stack.last() {
            Some(open) => Err(format!("<{open}> never closed")),
            None => Ok(opened),
        }
    }

    pub(crate) fn counter(class: u32, bins: &[(usize, u64)]) -> CounterReport {
        let mut all = vec![0u64; BIN_COUNT];
        for &(i, c) in bins {
            all[i] = c;
        }
        CounterReport {
            class,
            arch: "sm_90".into(),
            merged_from: Vec::new(),
            catalogue: 1,
            counter: 5,
            name: "kernel_duration".into(),
            unit: "ns".into(),
            reports: 300,
            samples: all.iter().sum(),
            contributors_at_least: 13,
            sums: 1,
            epochs: vec![20_000],
            held_back_reports: 0,
            bound_enforced_by_tokens: false,
            bins: all,
            mean: Some(1.0),
            p50: Some(1.0),
            p90: Some(2.0),
            p99: Some(3.0),
            label: None,
            joint: None,
        }
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(
            escape(r#"<script>alert("x" & 'y')</script>"#),
            "&lt;script&gt;alert(&quot;x&quot; &amp; &#39;y&#39;)&lt;/script&gt;"
        );
        let mut svg = Svg::new(10, 10, "a < b");
        svg.text(0.0, 0.0, Anchor::Start, 10, "<script>&");
        let out = svg.finish();
        assert!(!out.contains("<script"), "{out}");
        assert!(out.contains("&lt;script&gt;&amp;"), "{out}");
        check_tags(&out).unwrap();
    }

    #[test]
    fn a_histogram_draws_one_bar_per_non_empty_bin_and_is_well_formed() {
        let c = counter(7, &[(0, 5), (10, 90), (127, 1)]);
        let svg = histogram(&c, Some("<script>alert(1)</script> & co"));
        let tags = check_tags(&svg).unwrap();
        assert_eq!(tags.iter().filter(|t| *t == "rect").count(), 3, "{svg}");
        assert_eq!(svg.matches(r#"class="bar""#).count(), 3);
        assert!(svg.contains("&lt;script&gt;alert(1)&lt;/script&gt; &amp; co"));
        assert!(!svg.contains("<script"));
        // The catalogue's edges: kernel_duration is log-binned in ns.
        assert!(svg.contains("logarithmic bins"), "{svg}");
        assert!(svg.contains(r#"viewBox="0 0 640 230""#));
        // An empty histogram draws axes and no bar.
        let empty = histogram(&counter(7, &[]), None);
        assert_eq!(
            check_tags(&empty)
                .unwrap()
                .iter()
                .filter(|t| *t == "rect")
                .count(),
            0
        );
    }

    /// A decrypted joint view of 90 short, fully occupied launches and 10 long, poorly
    /// occupied ones.
    pub(crate) fn joint_counter(class: u32) -> CounterReport {
        let joint = Catalogue::current()
            .joint_by_name("duration_x_occupancy")
            .unwrap();
        let mut c = counter(class, &[]);
        c.bins[joint.bin(2_000.0, 90.0).unwrap().index()] = 90;
        c.bins[joint.bin(1e6, 20.0).unwrap().index()] = 10;
        c.samples = 100;
        c.catalogue = 2;
        c.counter = joint.view.id.0;
        c.name = joint.view.name.into();
        c.unit = String::new();
        c.joint = Some(JointSummary::new(
            &joint,
            &c.bins,
            crate::joint::Split {
                x: 10_000.0,
                y: 50.0,
            },
        ));
        c
    }

    #[test]
    fn a_heat_map_draws_its_non_empty_cells_the_split_and_the_quadrant_shares() {
        let c = joint_counter(4);
        let j = c.joint.as_ref().unwrap();
        let svg = heatmap(&c, j, Some("<b>bold</b>"));
        check_tags(&svg).unwrap();
        assert_eq!(svg.matches(r#"class="cell""#).count(), 2, "{svg}");
        assert_eq!(svg.matches(r#"class="split""#).count(), 2, "{svg}");
        // The quadrants' shares, and the cells' tooltips with their ranges.
        for text in [
            "90.0%",
            "10.0%",
            "0.0%",
            "kernel_duration [1.00 ms, 3.16 ms)",
        ] {
            assert!(svg.contains(text), "{text} in {svg}");
        }
        assert!(!svg.contains("<b>"));
        // The fuller cell is darker.
        let fills: Vec<&str> = svg
            .match_indices(r##"fill="#"##)
            .map(|(at, _)| &svg[at + 6..at + 13])
            .collect();
        assert!(fills.contains(&"#08306b"), "{fills:?}");
    }

    #[test]
    fn check_tags_finds_damage() {
        assert!(check_tags("<a><b></a></b>").is_err());
        assert!(check_tags("<a>").is_err());
        assert!(check_tags("<a>x & y</a>").is_err());
        assert!(check_tags("<a x=\"1></a>").is_err());
        assert!(check_tags("<a><b/></a>").is_ok());
    }
}
