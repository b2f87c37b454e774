//! The markdown report and the terminal summary.

use std::fmt::Write;

use penrose_core::fingerprint::{
    DEFAULT_NGRAM_LEN, DEFAULT_NUM_HASHES, DEFAULT_TAU, FingerprintParams, Weighting,
};

use super::cluster::Rule;
use super::corpus::{MIN_STREAM_KERNELS, Mode};
use super::elements::{EXACT_GAP_CAP, Elements};
use super::{Args, Cell, Encoding, Evaluation};

/// Everything from this line on in an existing report is hand-written (results of runs this
/// tool does not make) and kept when the report is regenerated.
pub const HAND_WRITTEN: &str = "<!-- Hand-written below this line: eval-fingerprints keeps it. -->";

/// The paper we compete with: accuracy of application identification at L = 10,000.
const PAPER_ACCURACY: f64 = 0.9536;

/// True similarity assumed for snippets of unrelated applications when bounding false matches:
/// measured medians are 0.00, and 0.05 leaves room for kernels every framework launches.
const UNRELATED_J: f64 = 0.05;

/// Largest acceptable probability that an unrelated snippet matches one given class. With
/// 100,000 classes that is one false match in 10,000 snippets.
const MAX_FALSE_MATCH: f64 = 1e-9;

/// P(X >= at_least) for X ~ Binomial(trials, p).
fn binomial_tail(trials: usize, p: f64, at_least: usize) -> f64 {
    if at_least == 0 {
        return 1.0;
    }
    if p <= 0.0 {
        return 0.0;
    }
    if p >= 1.0 {
        return if at_least <= trials { 1.0 } else { 0.0 };
    }
    // log pmf, summed from the threshold up, in log space to avoid underflow.
    let ln_choose = |m: usize| -> f64 {
        (0..m)
            .map(|i| ((trials - i) as f64).ln() - ((i + 1) as f64).ln())
            .sum()
    };
    (at_least..=trials)
        .map(|m| (ln_choose(m) + m as f64 * p.ln() + (trials - m) as f64 * (1.0 - p).ln()).exp())
        .sum()
}

/// Probability that a snippet of an unrelated application (true similarity [`UNRELATED_J`])
/// is estimated at >= tau against a class of `reps` representatives (union bound over them).
fn false_match(k: usize, enc: Encoding, tau: f64, reps: usize) -> f64 {
    let params = FingerprintParams {
        num_hashes: k,
        ..FingerprintParams::default()
    };
    let r = match enc {
        Encoding::Set256 | Encoding::Weighted256 => params.chance_collision(),
        Encoding::Set64 | Encoding::Weighted64 => 0.0,
    };
    let p = UNRELATED_J + (1.0 - UNRELATED_J) * r;
    let needed = (k as f64 * (tau * (1.0 - r) + r) - 1e-9).ceil().max(0.0) as usize;
    (binomial_tail(k, p, needed) * reps.max(1) as f64).min(1.0)
}

/// What merging classes and keeping several representatives gain: the shipped encoding, n and
/// tau under each simpler rule, means and minima over the (L, p) cells.
fn healing_table(eval: &Evaluation, n: usize) -> String {
    let mut w = String::new();
    let _ = writeln!(
        w,
        "\n## Healing split classes\n\n\
         {}, n = {n}, tau = {DEFAULT_TAU}, {} windows per sequence: the same windows, \
         arrival order and estimates under simpler class rules. \"job\" is the truth in which \
         ranks of one job are one application, \"file\" the one in which every file is its \
         own; \"false match per class\" bounds the chance that an unrelated snippet matches \
         (and, merging, joins) a class, over its representatives.\n\n\
         | sequences | class rule | own class, job (mean) | own class, job (min) | own class, file (mean) | own class, file (min) | mixed classes (max) | classes (mean) | false match per class |\n\
         |---|---|---|---|---|---|---|---|---|",
        default_encoding().label(),
        eval.windows_per_sequence
    );
    for mode in [Mode::Process, Mode::Stream] {
        let cells: Vec<&Cell> = eval
            .cells
            .iter()
            .filter(|c| c.mode == mode && c.n == n && c.elements == Elements::Named)
            .collect();
        let Some(first) = cells.first() else {
            continue;
        };
        for (i, h) in first.healing.iter().enumerate() {
            let pick = |f: &dyn Fn(&super::HealingScore) -> f64| -> Vec<f64> {
                cells
                    .iter()
                    .filter_map(|c| c.healing.get(i))
                    .map(f)
                    .collect()
            };
            let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
            let min = |v: &[f64]| v.iter().copied().fold(1.0, f64::min);
            let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
            let job = pick(&|h| h.score.own_class);
            let file = pick(&|h| h.score_by_file.own_class);
            let mixed = pick(&|h| h.score.mixed_classes);
            let classes = pick(&|h| h.score.classes as f64);
            let _ = writeln!(
                w,
                "| {mode:?} | {} | {} | {} | {} | {} | {} | {:.1} | {:.0e} |",
                short_rule(&h.rule),
                pct(mean(&job)),
                pct(min(&job)),
                pct(mean(&file)),
                pct(min(&file)),
                pct(max(&mixed)),
                mean(&classes),
                false_match(eval.k, default_encoding(), DEFAULT_TAU, h.rule.max_reps)
            );
        }
    }
    w
}

/// Why the job truth stays below the file truth: how alike ranks of one job are.
fn ranks_text(eval: &Evaluation) -> String {
    let mut w = String::new();
    if eval.ranks.is_empty() {
        return w;
    }
    let _ = writeln!(
        w,
        "\nRanks of one job, whole launch sequences (weighted Jaccard; \"halves\": the first \
         file's two halves against each other, for scale):\n\n\
         | files | kernels (1-grams) | {DEFAULT_NGRAM_LEN}-grams | {DEFAULT_NGRAM_LEN}-grams, halves of the first |\n|---|---|---|---|"
    );
    for r in &eval.ranks {
        let _ = writeln!(
            w,
            "| `{}`, `{}` | {:.2} | {:.2} | {:.2} |",
            r.files.0, r.files.1, r.kernels, r.ngrams, r.halves
        );
    }
    w
}

/// A class rule in a table cell.
fn short_rule(rule: &Rule) -> String {
    let reps = match rule.max_reps {
        1 => "1 representative".to_owned(),
        n => format!("{n} representatives"),
    };
    if rule.merge {
        format!("{reps}, merging")
    } else {
        format!("{reps}, no merging")
    }
}

/// The simulated aggregator's class rule in words.
fn rule_text(rule: &Rule) -> String {
    let reps = if rule.novelty >= 1.0 {
        format!("up to {} representatives, its first members", rule.max_reps)
    } else {
        format!(
            "up to {} representatives: a joining window whose best similarity is below \
             tau + {} (1 - tau) becomes one",
            rule.max_reps, rule.novelty
        )
    };
    if rule.merge {
        format!("{reps}; a window that matches several classes at >= tau merges them")
    } else {
        format!("{reps}; classes never merge")
    }
}

/// One (mode, n, encoding, tau) configuration, averaged over the (L, p) grid.
#[derive(Clone, Copy, Debug)]
pub struct Summary {
    mode: Mode,
    n: usize,
    encoding: Encoding,
    tau: f64,
    mean_own: f64,
    min_own: f64,
    mean_mixed: f64,
    max_mixed: f64,
    mean_own_by_file: f64,
    min_own_by_file: f64,
    false_match: f64,
}

impl Summary {
    /// What tau and configurations are chosen by: windows in their own class, with merges of
    /// applications counted against.
    fn merit(&self) -> f64 {
        self.mean_own - self.mean_mixed
    }
}

fn summarise(eval: &Evaluation, mode: Mode, n: usize, encoding: Encoding, tau: f64) -> Summary {
    summarise_elements(eval, Elements::Named, mode, n, encoding, tau)
}

fn summarise_elements(
    eval: &Evaluation,
    elements: Elements,
    mode: Mode,
    n: usize,
    encoding: Encoding,
    tau: f64,
) -> Summary {
    let scores: Vec<_> = eval
        .cells
        .iter()
        .filter(|c| c.mode == mode && c.n == n && c.elements == elements)
        .flat_map(|c| c.scores.iter())
        .filter(|s| s.encoding == encoding && s.tau == tau)
        .collect();
    let count = scores.len().max(1) as f64;
    let mean_own_by_file = scores
        .iter()
        .map(|s| s.score_by_file.own_class)
        .sum::<f64>()
        / count;
    let min_own_by_file = scores
        .iter()
        .map(|s| s.score_by_file.own_class)
        .fold(1.0, f64::min);
    let scores: Vec<_> = scores.iter().map(|s| s.score).collect();
    Summary {
        mode,
        n,
        encoding,
        tau,
        mean_own: scores.iter().map(|s| s.own_class).sum::<f64>() / count,
        min_own: scores.iter().map(|s| s.own_class).fold(1.0, f64::min),
        mean_mixed: scores.iter().map(|s| s.mixed_classes).sum::<f64>() / count,
        max_mixed: scores.iter().map(|s| s.mixed_classes).fold(0.0, f64::max),
        mean_own_by_file,
        min_own_by_file,
        false_match: false_match(eval.k, encoding, tau, eval.rule.max_reps),
    }
}

fn best_tau(eval: &Evaluation, args: &Args, mode: Mode, n: usize, enc: Encoding) -> Summary {
    best_tau_elements(eval, args, Elements::Named, mode, n, enc)
}

/// The tau chosen for one configuration: the best merit among the taus whose false-match
/// probability is at most [`MAX_FALSE_MATCH`].
fn best_tau_elements(
    eval: &Evaluation,
    args: &Args,
    elements: Elements,
    mode: Mode,
    n: usize,
    enc: Encoding,
) -> Summary {
    let all: Vec<Summary> = args
        .taus
        .iter()
        .map(|&tau| summarise_elements(eval, elements, mode, n, enc, tau))
        .collect();
    let safe: Vec<Summary> = all
        .iter()
        .copied()
        .filter(|s| s.false_match <= MAX_FALSE_MATCH)
        .collect();
    if safe.is_empty() { all } else { safe }
        .into_iter()
        .max_by(|a, b| {
            a.merit()
                .total_cmp(&b.merit())
                .then(b.tau.total_cmp(&a.tau))
        })
        .unwrap_or_else(|| summarise_elements(eval, elements, mode, n, enc, DEFAULT_TAU))
}

fn all_best(eval: &Evaluation, args: &Args) -> Vec<Summary> {
    let mut out = Vec::new();
    for mode in [Mode::Process, Mode::Stream] {
        for &n in &args.ngrams {
            for enc in Encoding::ALL {
                out.push(best_tau(eval, args, mode, n, enc));
            }
        }
    }
    out
}

fn cell_score(cell: &Cell, enc: Encoding, tau: f64) -> Option<super::Score> {
    cell.scores
        .iter()
        .find(|s| s.encoding == enc && s.tau == tau)
        .map(|s| s.score)
}

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

/// The shipped defaults, as an encoding of the 256-bit hash.
pub(super) fn default_encoding() -> Encoding {
    match FingerprintParams::default().weighting {
        Weighting::Set => Encoding::Set256,
        Weighting::Counts => Encoding::Weighted256,
    }
}

/// The per-(L, p) table of the 256-bit encodings and 64-bit values at their best taus.
fn key_table(eval: &Evaluation, args: &Args, mode: Mode, n: usize) -> String {
    let best: Vec<Summary> = Encoding::ALL
        .iter()
        .map(|&e| best_tau(eval, args, mode, n, e))
        .collect();
    let mut s = String::new();
    let _ = write!(s, "| L | p |");
    for b in &best {
        let _ = write!(s, " {} (tau {}) own / mixed |", b.encoding.label(), b.tau);
    }
    let _ = write!(s, "\n|---|---|");
    for _ in &best {
        let _ = write!(s, "---|");
    }
    s.push('\n');
    for cell in eval
        .cells
        .iter()
        .filter(|c| c.mode == mode && c.n == n && c.elements == Elements::Named)
    {
        let _ = write!(s, "| {} | {} |", cell.len, pct(cell.p));
        for b in &best {
            if let Some(sc) = cell_score(cell, b.encoding, b.tau) {
                let _ = write!(s, " {} / {} |", pct(sc.own_class), pct(sc.mixed_classes));
            }
        }
        s.push('\n');
    }
    s
}

/// The short summary printed on the terminal.
pub fn summary(eval: &Evaluation, args: &Args) -> String {
    let mut best = all_best(eval, args);
    best.sort_by(|a, b| b.merit().total_cmp(&a.merit()));
    let mut s = String::new();
    let _ = writeln!(
        s,
        "seed {}; best configurations (mean over L and p):",
        eval.seed
    );
    for b in best.iter().take(6) {
        let _ = writeln!(
            s,
            "  {:?} n={} {:<24} tau={:<4} own class {} (min {}), mixed classes {} (max {})",
            b.mode,
            b.n,
            b.encoding.label(),
            b.tau,
            pct(b.mean_own),
            pct(b.min_own),
            pct(b.mean_mixed),
            pct(b.max_mixed)
        );
    }
    if let Some(top) = best.first() {
        let _ = writeln!(s, "\n{:?}, n = {}:", top.mode, top.n);
        s.push_str(&key_table(eval, args, top.mode, top.n));
    }
    s.push_str(&super::graphs::summary(&eval.graphs));
    s
}

/// The whole document.
pub fn render(eval: &Evaluation, args: &Args) -> String {
    let mut s = title(eval);
    s.push_str(&data_section(eval));
    s.push_str(&method_section(eval, args));
    s.push_str(&exact_section(eval));
    let mut best = all_best(eval, args);
    s.push_str(&summary_section(&best));
    best.sort_by(|a, b| b.merit().total_cmp(&a.merit()));
    s.push_str(&key_section(eval, args));
    s.push_str(&tau_sweep(eval, args));
    s.push_str(&choice_section(eval, &best));
    s.push_str(CHOICE_TEXT);
    s.push('\n');
    s.push_str(&names_section(eval, args));
    s
}

/// The heading, and the command and data the document was generated from.
fn title(eval: &Evaluation) -> String {
    let mut s = String::new();
    let w = &mut s;
    let _ = writeln!(w, "# Fingerprint evaluation\n");
    let _ = writeln!(
        w,
        "Generated by `cargo run --release -p xtask -- eval-fingerprints --seed {} --windows {}` \
         (k = {}; classes: {}) on `{}`: {} kernels, {} applications. \
         Rerun it to reproduce every number below; `--json` prints them all.\n",
        eval.seed,
        eval.windows_per_sequence,
        eval.k,
        rule_text(&eval.rule),
        eval.traces,
        eval.kernels,
        eval.applications.len()
    );
    s
}

/// The applications and the sequences windows are drawn from.
fn data_section(eval: &Evaluation) -> String {
    let mut s = String::new();
    let w = &mut s;
    let _ = writeln!(w, "## Data\n");
    let _ = writeln!(
        w,
        "Ground truth: one trace file is one application, except files whose names differ only \
         in a rank number, which are ranks of one job. Applications:\n"
    );
    for app in &eval.applications {
        let _ = writeln!(w, "- `{app}`");
    }
    let _ = writeln!(
        w,
        "\nPer-process sequences (launch order: by the timestamp of the CUDA runtime launch call linked through the correlation id, else the kernel's start):\n"
    );
    for (file, len) in &eval.process_sequences {
        let _ = writeln!(w, "- `{file}`: {len} launches");
    }
    let _ = writeln!(
        w,
        "\nPer-stream sequences (streams with at least {MIN_STREAM_KERNELS} launches; the label \
         is the job plus the stream id, so ranks' equal streams share a label):\n"
    );
    for (file, len) in &eval.stream_sequences {
        let _ = writeln!(w, "- `{file}`: {len} launches");
    }
    s
}

/// How windows are drawn, fingerprinted, clustered and scored.
fn method_section(eval: &Evaluation, args: &Args) -> String {
    let mut s = String::new();
    let w = &mut s;
    let _ = writeln!(w, "\n## Method\n");
    let _ = writeln!(
        w,
        "- **Windows.** Each sequence is looped (a long run repeats its iterations). A window is \
         the first L launches an agent records from a uniformly random offset; {} windows per \
         sequence for each L in {:?} and each p in {:?}.\n\
         - **Perturbation.** Each launch is, with probability p, dropped, replaced by a kernel \
         of another application, or followed by one (one of the three uniformly; the foreign \
         kernel is drawn uniformly from the launches of all other applications). This stands \
         for interleaved processes, data-dependent kernel choices and renamed kernels.\n\
         - **Fingerprints.** n-gram shingles of names, SHA-256, k = {} MinHash functions. \
         *set*: MinHash over distinct shingles. *weighted*: MinHash over shingle counts (the \
         i-th occurrence of a shingle is its own element, so the estimate is the multiset \
         Jaccard Σ min / Σ max). *256-bit*: b-bit MinHash, b = 256 / k bits of each value, \
         estimate corrected for chance collisions: Ĵ = (p̂ − 2^-b) / (1 − 2^-b). *64-bit values*: \
         the share of equal full values.\n\
         - **Classes.** The aggregator's online rule (docs/design.md section 6): the windows of one \
         (L, p) cell arrive in random order; each joins the class whose representatives it \
         matches best, if the estimated similarity is >= tau, otherwise it founds a new class \
         ({}).\n\
         - **In its own application's class.** A window counts as correct when (1) its class \
         has a strict majority label and it is the window's label, and (2) its class holds \
         more of that label's windows than any other class (ties: the class founded first). \
         (1) makes a merge of applications wrong for the minority, (2) makes a split of one \
         application into several classes wrong for all but its largest class. Per process the \
         label is the application; per stream it is (application, stream).\n\
         - **Mixed classes.** The share of classes that hold windows of two or more applications.\n\
         - **False matches at fleet scale.** A handful of applications cannot show merges that a \
         fleet with 100,000 classes would see, so each (encoding, tau) also gets the \
         probability that a snippet of an unrelated application (true similarity {UNRELATED_J}) \
         is estimated at >= tau against one class: a binomial tail over the k values \
         (agreement probability J + (1 − J) 2^-b for the 256-bit hash, J for full values) \
         against one representative, times the most representatives a class holds (union \
         bound). Under merging a false match would also join two classes, so this is the \
         bound on wrong merges per snippet and class too.\n\
         - **Choosing tau.** For each mode, n and encoding, among the taus in {:?} whose false \
         match probability is at most {MAX_FALSE_MATCH:.0e}, the one that maximises the mean over \
         all (L, p) of own-class share minus mixed-class share.\n\
         - **Exact Jaccard.** Medians over the windows of a cell, per process: a perturbed \
         window against the same window unperturbed (\"vs itself\"), against an unperturbed window of the same sequence at an independent offset \
         (\"vs clean\"), two independently perturbed windows (\"both\"), and a perturbed window \
         against an unperturbed window of another application (\"other\").\n",
        eval.windows_per_sequence,
        args.lengths,
        args.perturb,
        eval.k,
        rule_text(&eval.rule),
        args.taus
    );
    s
}

/// Exact Jaccard medians of the named process cells.
fn exact_section(eval: &Evaluation) -> String {
    let mut s = String::new();
    let w = &mut s;
    let _ = writeln!(w, "## Exact Jaccard (per process)\n");
    let _ = writeln!(
        w,
        "| n | L | p | set vs itself | weighted vs itself | set vs clean | weighted vs clean | set both | weighted both | set other | weighted other |\n|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for c in eval
        .cells
        .iter()
        .filter(|c| c.mode == Mode::Process && c.elements == Elements::Named)
    {
        let e = &c.exact;
        let _ = writeln!(
            w,
            "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            c.n,
            c.len,
            pct(c.p),
            e.own_set,
            e.own_weighted,
            e.same_set,
            e.same_weighted,
            e.both_set,
            e.both_weighted,
            e.other_set,
            e.other_weighted
        );
    }
    let _ = writeln!(
        w,
        "\nReference figures measured earlier at L = 2,500 (exact Jaccard): 8-grams under 1% \
         perturbation, set 0.74 and weighted 0.88; under 5%, 0.36 and 0.50 (4-grams: 0.47 and \
         0.73); different applications near 0. Compare the L = 2500 rows above.\n"
    );
    s
}

/// Each configuration at its best tau, in `best`'s order.
fn summary_section(best: &[Summary]) -> String {
    let mut s = String::new();
    let w = &mut s;
    let _ = writeln!(w, "## Summary: each configuration at its best tau\n");
    let _ = writeln!(
        w,
        "Means and extremes over all (L, p) cells. \"per file\" scores the same classes against the \
         stricter truth in which every file is its own application (ranks of one job apart).\n\n\
         | sequences | n | encoding | tau | own class (mean) | own class (min) | mixed classes (mean) | mixed classes (max) | own class, per file (mean) | false match per class |\n|---|---|---|---|---|---|---|---|---|---|"
    );
    for b in best {
        let _ = writeln!(
            w,
            "| {:?} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0e} |",
            b.mode,
            b.n,
            b.encoding.label(),
            b.tau,
            pct(b.mean_own),
            pct(b.min_own),
            pct(b.mean_mixed),
            pct(b.max_mixed),
            pct(b.mean_own_by_file),
            b.false_match
        );
    }
    s
}

/// The key table of the shipped defaults' mode and n, what healing gains, and how alike
/// ranks are.
fn key_section(eval: &Evaluation, args: &Args) -> String {
    let mut s = String::new();
    let w = &mut s;
    let def_n = DEFAULT_NGRAM_LEN;
    let _ = writeln!(
        w,
        "\n## Key table: shipped defaults' mode and n, per (L, p)\n\n\
         Per process, n = {def_n}: share of windows in their own application's class / share \
         of mixed classes, each encoding at its best tau.\n"
    );
    w.push_str(&key_table(eval, args, Mode::Process, def_n));
    w.push_str(&healing_table(eval, def_n));
    w.push_str(&ranks_text(eval));
    s
}

/// Every tau, each encoding's means per process at the shipped n.
fn tau_sweep(eval: &Evaluation, args: &Args) -> String {
    let mut s = String::new();
    let w = &mut s;
    let def_n = DEFAULT_NGRAM_LEN;
    let _ = writeln!(w, "\n## tau sweep (per process, n = {def_n})\n");
    let _ = write!(w, "| tau |");
    for e in Encoding::ALL {
        let _ = write!(w, " {} own / mixed |", e.label());
    }
    let _ = write!(
        w,
        " false match, 256-bit | false match, 64-bit |\n|---|---|---|---|---|---|---|"
    );
    w.push('\n');
    for &tau in &args.taus {
        let _ = write!(w, "| {tau} |");
        for e in Encoding::ALL {
            let sm = summarise(eval, Mode::Process, def_n, e, tau);
            let _ = write!(w, " {} / {} |", pct(sm.mean_own), pct(sm.mean_mixed));
        }
        let _ = writeln!(
            w,
            " {:.0e} | {:.0e} |",
            false_match(eval.k, Encoding::Set256, tau, eval.rule.max_reps),
            false_match(eval.k, Encoding::Set64, tau, eval.rule.max_reps)
        );
    }
    s
}

/// The mean own-class share (or per file) of one configuration over the named process cells at
/// L = 10,000, or "not measured".
fn at_10k(eval: &Evaluation, enc: Encoding, n: usize, tau: f64, by_file: bool) -> String {
    let v: Vec<f64> = eval
        .cells
        .iter()
        .filter(|c| c.mode == Mode::Process && c.n == n && c.len == 10_000)
        .filter(|c| c.elements == Elements::Named)
        .filter_map(|c| c.scores.iter().find(|s| s.encoding == enc && s.tau == tau))
        .map(|s| {
            if by_file {
                s.score_by_file.own_class
            } else {
                s.score.own_class
            }
        })
        .collect();
    if v.is_empty() {
        "not measured".into()
    } else {
        pct(v.iter().sum::<f64>() / v.len() as f64)
    }
}

/// What penrose-core ships and how it scores here, and the best configuration measured
/// (`best` sorted best first).
fn choice_section(eval: &Evaluation, best: &[Summary]) -> String {
    let mut s = String::new();
    let w = &mut s;
    let (def_n, def_tau, def_enc) = (DEFAULT_NGRAM_LEN, DEFAULT_TAU, default_encoding());
    let shipped = summarise(eval, Mode::Process, def_n, def_enc, def_tau);
    let _ = writeln!(w, "\n## Choice\n");
    let _ = writeln!(
        w,
        "penrose-core ships: per-process snippets, n = {def_n}, k = {DEFAULT_NUM_HASHES}, \
         encoding \"{}\", tau = {def_tau}. On these traces that scores a mean own-class share \
         of {} (minimum {}), {} mixed classes on average (max {}), and {} with every file counted \
         as its own application. At L = 10,000, averaged over p: {} ({} per file). The paper \
         reports {:.2}% at L = 10,000; its setting (set MinHash, n = 8, tau = 0.85) scores {} \
         ({} per file) here.\n",
        def_enc.label(),
        pct(shipped.mean_own),
        pct(shipped.min_own),
        pct(shipped.mean_mixed),
        pct(shipped.max_mixed),
        pct(shipped.mean_own_by_file),
        at_10k(eval, def_enc, def_n, def_tau, false),
        at_10k(eval, def_enc, def_n, def_tau, true),
        100.0 * PAPER_ACCURACY,
        at_10k(eval, Encoding::Set256, 8, 0.85, false),
        at_10k(eval, Encoding::Set256, 8, 0.85, true),
    );
    if let Some(top) = best.first() {
        let _ = writeln!(
            w,
            "The best configuration measured on this folder: {:?}, n = {}, {}, tau = {} \
             (own class {} mean, mixed classes {} mean).\n",
            top.mode,
            top.n,
            top.encoding.label(),
            top.tau,
            pct(top.mean_own),
            pct(top.mean_mixed)
        );
    }
    s
}

/// The encodings the names section compares: the shipped MinHash encoding and its full-value
/// counterpart.
const NAMES_ENCODINGS: [Encoding; 2] = [Encoding::Weighted256, Encoding::Weighted64];

/// "Names or launch shapes": every launch encoding under the shipped MinHash encoding, both
/// modes, both truths, every (L, p) cell, and the recommendation.
fn names_section(eval: &Evaluation, args: &Args) -> String {
    let mut s = names_intro(eval, args);
    s.push_str(&accuracy_table(eval, args));
    for mode in [Mode::Process, Mode::Stream] {
        s.push_str(&every_cell_table(eval, args, mode));
    }
    s.push_str(&exact_elements_table(eval, args));
    s.push_str(&recommendation(eval, args));
    s.push_str(NAMES_TEXT);
    s.push_str(&super::graphs::section(&eval.graphs));
    s
}

/// The section's heading, and each launch encoding and what the traces lack, in words.
fn names_intro(eval: &Evaluation, args: &Args) -> String {
    let mut s = String::new();
    let w = &mut s;
    let _ = writeln!(
        w,
        "## Names or launch shapes
"
    );
    let _ = writeln!(
        w,
        "On real GPUs many launches have no name the agent can read (docs/evaluation.md, \
         \"Capture on a real GPU\"). Each encoding below turns every launch of a window into \
         one element, then shingles, hashes and clusters the elements exactly as names are (same \
         windows, perturbations, n, k, b-bit hash, online rule and tau rule):\n\n\
         - **names**: the kernel name's SHA-256 (today's encoding).\n\
         - **name-free** (`penrose_core::fingerprint::LaunchShape`): SHA-256 of a domain tag, \
         grid (x, y, z), block (x, y, z), shared memory per block in bytes, and the gap \
         bucket: 0 for the first launch of a handle in the window, else \
         1 + floor(log2(distance)), capped at {max_bucket}, where distance counts launches of \
         the same sequence back to the previous launch with the same handle. No name enters \
         the shape; in the traces the kernel name stands for the per-process handle, which \
         the shape uses only for equality, so a consistent renaming of handles leaves the \
         shape sequence unchanged (unit test \
         `renaming_handles_by_a_bijection_leaves_the_shapes_unchanged`).\n\
         - **both**: one element per launch, SHA-256 of a tag, the name's digest and the \
         launch shape (`combined_digest`), so a shingle matches only when names, \
         configurations and gap buckets all match. (Chosen over the union of a name shingle \
         set and a name-free shingle set: the union would give every process whose launches \
         are mostly unnamed half of its shingles in common with every other such process, \
         while the combined element of an unnamed launch, with a fixed placeholder name, \
         degrades to the launch shape.)\n\
         - **name-free, gaps carried across windows**: as name-free, but the distances reach \
         back before the window (the agent would keep each handle's last launch index per \
         process across its windows; here the history is the looped sequence before the \
         window's offset), so only a process's first launch of a kernel gets bucket 0 and \
         windows at different offsets no longer differ in the first launch of every kernel.\n\
         {seen}\
         - **name-free, exact gap <= {cap}**: as name-free with min(distance, {cap}) in place \
         of the bucket: the alternative the log bucket is measured against.\n\n\
         What the traces lack: the profiler records *static plus dynamic* shared memory per \
         block (`shared memory`); the launch call the agent sees passes only the dynamic \
         part. The static part is a constant of the kernel, so the traces' shapes are at most \
         finer than the agent's (two kernels with equal grid, block and dynamic shared memory \
         but different static shared memory are told apart here, not by the agent). Grid and \
         block are what the launch call passes. {missing} of {kernels} kernels lack a field \
         of the configuration. The traces hold {names} distinct names and {configs} distinct \
         configurations.\n",
        max_bucket = penrose_core::fingerprint::MAX_GAP_BUCKET,
        cap = EXACT_GAP_CAP,
        seen = if args.elements.contains(&Elements::NameFreeSeen) {
            "- **name-free, gaps carried across the agent's windows**: as the previous one with \
             the history the agent can keep: its probes are detached between windows, so \
             what it saw before a window is its previous window (here L launches at an \
             independent offset), and the launches in between are missing from every \
             distance that spans them.\n"
        } else {
            ""
        },
        missing = eval.kernels_without_config,
        kernels = eval.kernels,
        names = eval.distinct_names,
        configs = eval.distinct_configs,
    );
    s
}

/// Each mode, n, MinHash and launch encoding at its own tau.
fn accuracy_table(eval: &Evaluation, args: &Args) -> String {
    let mut s = String::new();
    let w = &mut s;
    let _ = writeln!(
        w,
        "### Accuracy per encoding\n\n\
         Means and minima over all (L, p) cells, each configuration at its own tau (same rule: \
         false match <= {MAX_FALSE_MATCH:.0e}, best mean own class minus mixed classes). \
         \"own class\" is the job truth (ranks of one job are one application), \"per file\" \
         the file truth; mixed classes count classes holding two or more jobs.\n\n\
         | sequences | elements | n | MinHash | tau | own class (mean) | own class (min) | own class, per file (mean) | own class, per file (min) | mixed classes (mean) | mixed classes (max) |\n\
         |---|---|---|---|---|---|---|---|---|---|---|"
    );
    for mode in [Mode::Process, Mode::Stream] {
        for &n in &args.ngrams {
            for enc in NAMES_ENCODINGS {
                for &elements in &args.elements {
                    let b = best_tau_elements(eval, args, elements, mode, n, enc);
                    let _ = writeln!(
                        w,
                        "| {:?} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                        mode,
                        elements.label(),
                        n,
                        enc.label(),
                        b.tau,
                        pct(b.mean_own),
                        pct(b.min_own),
                        pct(b.mean_own_by_file),
                        pct(b.min_own_by_file),
                        pct(b.mean_mixed),
                        pct(b.max_mixed),
                    );
                }
            }
        }
    }
    s
}

/// Every (L, p) cell of `mode` at the shipped n and MinHash, each launch encoding at its tau.
fn every_cell_table(eval: &Evaluation, args: &Args, mode: Mode) -> String {
    let mut s = String::new();
    let w = &mut s;
    let enc = default_encoding();
    let n = DEFAULT_NGRAM_LEN;
    let best: Vec<(Elements, Summary)> = args
        .elements
        .iter()
        .map(|&t| (t, best_tau_elements(eval, args, t, mode, n, enc)))
        .collect();
    let _ = writeln!(
        w,
        "\n### Every (L, p) cell: {mode:?}, n = {n}, {}\n\n\
         own class / own class per file / mixed classes, each launch encoding at its tau.\n",
        enc.label()
    );
    let _ = write!(w, "| L | p |");
    for (t, b) in &best {
        let _ = write!(w, " {} (tau {}) |", t.label(), b.tau);
    }
    let _ = write!(w, "\n|---|---|");
    for _ in &best {
        let _ = write!(w, "---|");
    }
    w.push('\n');
    let cells = |t: Elements| {
        eval.cells
            .iter()
            .filter(move |c| c.mode == mode && c.n == n && c.elements == t)
    };
    for cell in cells(Elements::Named) {
        let _ = write!(w, "| {} | {} |", cell.len, pct(cell.p));
        for (t, b) in &best {
            let found = cells(*t)
                .find(|c| c.len == cell.len && c.p == cell.p)
                .and_then(|c| {
                    c.scores
                        .iter()
                        .find(|s| s.encoding == enc && s.tau == b.tau)
                });
            match found {
                Some(sc) => {
                    let _ = write!(
                        w,
                        " {} / {} / {} |",
                        pct(sc.score.own_class),
                        pct(sc.score_by_file.own_class),
                        pct(sc.score.mixed_classes)
                    );
                }
                None => w.push_str(" |"),
            }
        }
        w.push('\n');
    }
    s
}

/// Exact weighted Jaccard medians of each launch encoding, per process at the shipped n.
fn exact_elements_table(eval: &Evaluation, args: &Args) -> String {
    let mut s = String::new();
    let w = &mut s;
    let n = DEFAULT_NGRAM_LEN;
    let _ = writeln!(
        w,
        "\n### Exact weighted Jaccard per encoding (per process, n = {n})\n\n\
         Medians as in \"Exact Jaccard\" above: a perturbed window against an unperturbed \
         window of the same sequence at another offset (\"vs clean\"), and against one of \
         another application (\"other\").\n"
    );
    let _ = write!(w, "| L | p |");
    for t in &args.elements {
        let _ = write!(w, " {} vs clean / other |", t.label());
    }
    let _ = write!(w, "\n|---|---|");
    for _ in &args.elements {
        let _ = write!(w, "---|");
    }
    w.push('\n');
    let process = |t: Elements| {
        eval.cells
            .iter()
            .filter(move |c| c.mode == Mode::Process && c.n == n && c.elements == t)
    };
    for cell in process(Elements::Named) {
        let _ = write!(w, "| {} | {} |", cell.len, pct(cell.p));
        for &t in &args.elements {
            match process(t).find(|c| c.len == cell.len && c.p == cell.p) {
                Some(c) => {
                    let _ = write!(
                        w,
                        " {:.2} / {:.2} |",
                        c.exact.same_weighted, c.exact.other_weighted
                    );
                }
                None => w.push_str(" |"),
            }
        }
        w.push('\n');
    }
    s
}

/// The launch encoding that scores best per process under the shipped n and MinHash (the
/// capped exact gaps left out), against the others.
fn recommendation(eval: &Evaluation, args: &Args) -> String {
    let mut s = String::new();
    let w = &mut s;
    let enc = default_encoding();
    let n = DEFAULT_NGRAM_LEN;
    let shipped: Vec<(Elements, Summary)> = args
        .elements
        .iter()
        .filter(|&&t| t != Elements::NameFreeExact)
        .map(|&t| (t, best_tau_elements(eval, args, t, Mode::Process, n, enc)))
        .collect();
    if let Some((top, b)) = shipped
        .iter()
        .max_by(|a, b| a.1.merit().total_cmp(&b.1.merit()))
    {
        let _ = writeln!(
            w,
            "\n### Recommendation\n\n\
             Measured on this folder, per process, n = {n}, {} (what the agent ships): \
             {} scores best, own class {} mean ({} per file), mixed classes {} mean, at tau = \
             {}. The others: {}.\n",
            enc.label(),
            top.label(),
            pct(b.mean_own),
            pct(b.mean_own_by_file),
            pct(b.mean_mixed),
            b.tau,
            shipped
                .iter()
                .filter(|(t, _)| t != top)
                .map(|(t, s)| format!(
                    "{} {} ({} per file, mixed {}, tau {})",
                    t.label(),
                    pct(s.mean_own),
                    pct(s.mean_own_by_file),
                    pct(s.mean_mixed),
                    s.tau
                ))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    s
}

/// The reasoning behind the names section's recommendation, and its privacy side.
const NAMES_TEXT: &str = "\
#### What to ship (decided on `../shared/traces`, seed 20261129)

- **Names where the agent has them.** Names score best in every summary row above (per process \
and per stream, n = 4 and 8, 256-bit hash and full values, both truths), with 0 mixed classes \
like every encoding here. The agent keeps fingerprinting names, and issue 9's name sources \
(items 1 to 3) are what makes that hold on real CUDA stacks.\n\
- **Launch shapes where it has none, gaps counted inside the window.** Without \
perturbation launch shapes come close to names (the p = 0 rows: per process from L = 2,500 \
on, own class as for names; exact Jaccard at L = 1,000 0.62 counted inside the window, \
0.77 carried, 0.79 for names): launch configurations and repetition distances tell these \
applications apart almost as well as names. They lose under perturbation, because one dropped or \
inserted launch also moves the repetition distance of every kernel launched across it, and a \
foreign kernel brings shapes of its own: most at p = 5%, least at L = 10,000. Carrying each \
handle's last launch across windows is worth about 5 points over counting inside the window \
when the history is the launches right before the window, which the agent never sees: its \
probes are detached between windows. What it could carry is its previous window's launches \
(`--elements name-free-seen`, measured in the hand-written section below), which scores below \
counting inside the window, so the agent counts inside each snippet. The log bucket is worth \
about 12 points over exact distances capped at 64. A process whose launches the agent cannot \
name gets this fingerprint rather than a useless `<unnamed>` one; its named launches keep \
their names in the same snippet.\n\
- **Not both in one element.** The combined element is as fragile as the name-free one (it \
carries the same gap) and adds nothing measurable: it scores within a few points of \
window-local launch shapes, mostly below, and below names everywhere. \
Names and name-free snippets of one application do not match each other, so a report must \
say which encoding made its snippet hash and the aggregator must compare only like with \
like; which one a window uses should follow from the share of its launches that carry a \
name (a rule this evaluation does not measure).\n\
- **Limits.** As for names (seven traces, six applications). The traces record static plus \
dynamic shared memory, the agent sees dynamic only, which may merge some configurations the \
traces keep apart. Configurations depend on the GPU and on tensor shapes (cuBLAS picks \
kernels and tiles per architecture; grids follow batch and model sizes), so one application \
on two GPU models or batch sizes may form two name-free classes where names form one: these \
traces cannot show that.\n\
\n\
#### What a name-free fingerprint reveals

- **What leaves the agent is unchanged:** the 256-bit snippet hash, 2 bits of each of 100 \
minima. No name, configuration or distance is sent; shape digests never leave the agent.\n\
- **What a shape stands for:** grid, block, shared memory and a repetition bucket instead of \
a kernel name. That says nothing of which library or code ran, but configurations follow \
tensor shapes (a grid is roughly a problem size divided by a tile), so a shape is about the \
*shapes* of the work where a name is about its *code*.\n\
- **Reversing a shingle** means enumerating n-tuples of elements instead of names. Plausible \
configurations are small, often powers of two, and a framework's launch shapes follow from a \
model's dimensions, so the shape alphabet is no harder to guess than names (these traces hold \
1,116 distinct configurations against 405 names, times up to 17 gap buckets); as for names \
this only matters where a digest or a full minimum is exposed, which the 256-bit hash \
prevents.\n\
- **Confirming a guessed application still works**, as it must, since it is the membership \
test fingerprints exist for: whoever can run the guessed application computes its snippet \
hash and compares. With names the guess is the code (framework and model); name-free, the \
guess must also reproduce the shapes (model dimensions, batch size) and a GPU that makes the \
same kernel choices, so a match confirms somewhat more (those shapes) and a guess of the code \
alone confirms less. The repetition buckets add the rhythm of the workload (kernels per layer, \
iteration length to a power of two), which the n-gram order of names already implies.\n";

/// Reasoning that does not depend on the folder: the privacy side of each choice.
const CHOICE_TEXT: &str = "\
### Why these defaults (decided on `../shared/traces`, seed 20261129)

- **Weighted over set MinHash.** Set Jaccard of 8-grams falls to about 0.74 under 1% of \
perturbed launches and to a third under 5%; at L = 10,000 a looped window holds every shingle \
once the trace is shorter, so a few foreign kernels add many new shingles while removing none, \
and set similarity collapses as L grows. Shingle counts dilute the same foreign shingles by \
the repetitions of the real ones, so weighted Jaccard stays high, and the weighted encodings \
win every (mode, n) in the summary by 10 to 25 points.\n\
- **n = 4 over n = 8.** A perturbed launch spoils n shingles, so 4-grams lose half as much \
similarity; in the summary n = 4 is ahead by several points on average and much better in the \
worst cell (p = 5%).\n\
- **tau = 0.46.** Accuracy falls steadily with tau (the sweep), because windows at different \
offsets of a long trace and perturbed windows rarely reach 0.85. The floor is set by false \
matches at fleet scale: with 2-bit values, an unrelated snippet agrees on a quarter of them by \
chance, and below 0.46 the chance that it passes tau against one class (up to 8 \
representatives, union bound) exceeds 1e-9. Under merging a false match would also join two \
classes, so the same bound holds for wrong merges.\n\
- **256-bit hash over full values.** Full 64-bit values could use tau = 0.3 and score a few \
points higher, but they are 25 times larger and expose each minimum exactly (see below).\n\
- **Per process over per stream.** Per-stream snippets score a few points higher, but a \
process's streams then form separate classes that the design server must join again, and the \
agent's windows are per process (docs/design.md section 3); we report both and keep per process.\n\
- **Against the paper's 95.36%.** Our figure is not comparable one to one: it counts windows \
that land in a class other than their application's largest as errors, includes perturbed \
windows and L = 1,000, and treats the two ranks of `trace_filter` (whose 4-gram similarity is \
about 0.1: sampled, not identical, iterations) as one application, which costs one seventh \
of the windows. The per-file figures are the ones to set against the paper's.\n\
- **Limits.** Seven traces of six applications, windows drawn from short looped traces; a \
fleet holds many more applications, which the false-match bound, not the mixed-class column, \
speaks for.\n\
\n\
### What each choice costs in privacy

- **n-gram length.** A shingle digest is reversed by enumerating n-tuples of candidate kernel \
names and hashing them. With a vocabulary of V plausible names that is V^n tries: for V = 1,000, \
10^12 at n = 4 and 10^24 at n = 8. Real kernel sequences are highly predictable (these traces use \
49 to 194 distinct names each), so an attacker who knows a framework's launch order tests far \
fewer tuples, and shorter shingles fall first: n = 4 leaks more than n = 8 wherever a shingle \
digest or a full minimum is exposed.\n\
- **What is actually sent.** Reports carry only the 256-bit snippet hash: b = 2 bits of each of \
k = 100 minima, not the digests. Two bits of a minimum do not identify a shingle; an attacker can \
only test a guessed snippet (a whole guessed kernel sequence) against a hash, which is the \
membership test the fingerprint exists to allow. Full 64-bit values would let a guessed \
shingle be confirmed against a single minimum, so they never leave the agent; this is also \
what keeps the shorter n acceptable.\n\
- **Weighted MinHash** sends nothing more than set MinHash (the same 256 bits), but its minima \
depend on how often a shingle occurs, so a confirmed guess also confirms a repetition count.\n\
- **tau** is a server-side threshold and costs nothing in privacy; a lower tau raises the risk \
of merging applications, which the false-match column bounds.\n";
