//! `cargo xtask eval-fingerprints`: how well snippet fingerprints identify applications on a
//! folder of real traces, written to `docs/evaluation.md` (method and definitions are in the
//! generated document).
//!
//! - [`corpus`]: the traces as labelled sequences of interned launches (name, configuration).
//! - [`windows`]: capture windows at random offsets of the looped sequences, perturbed.
//! - [`elements`]: each window as kernel names, launch shapes, or both.
//! - [`cluster`]: the aggregator's online clustering, simulated, and its score.
//! - [`graphs`]: CUDA graph launches expanded into their kernels or not (issue 24).
//! - [`report`]: the markdown document.

mod cluster;
mod corpus;
mod elements;
mod graphs;
mod report;
mod windows;

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use penrose_core::fingerprint::{
    DEFAULT_NGRAM_LEN, DEFAULT_NUM_HASHES, DEFAULT_TAU, FingerprintParams, MAX_GAP_BUCKET,
    MinHashSignature, MinHasher, ShingleKey, SnippetHash, Weighting,
};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use cluster::{Score, SimMatrix};
use corpus::{Corpus, LaunchId, Mode, Source};
use elements::{ElementWriter, Elements};

/// Arguments.
#[derive(clap::Args, Clone)]
pub struct Args {
    /// Folder of `.json` / `.json.gz` profiler traces [default: $PENROSE_TRACES, else
    /// ../shared/traces next to the workspace].
    #[arg(long)]
    traces: Option<PathBuf>,
    /// Seed of every random choice (offsets, perturbations, arrival order).
    #[arg(long, default_value_t = 20_261_129)]
    seed: u64,
    /// Windows drawn per (sequence, L, p). A fleet sends far more windows of a popular
    /// application a day; merging classes needs windows that bridge distant offsets.
    #[arg(long, default_value_t = 48)]
    windows: usize,
    /// Window lengths L.
    #[arg(long, value_delimiter = ',', default_values_t = [1_000, 2_500, 10_000])]
    lengths: Vec<usize>,
    /// Shares p of perturbed launches.
    #[arg(long, value_delimiter = ',', default_values_t = [0.0, 0.005, 0.01, 0.02, 0.05])]
    perturb: Vec<f64>,
    /// n-gram lengths to compare.
    #[arg(long, value_delimiter = ',', default_values_t = [4, 8])]
    ngrams: Vec<usize>,
    /// Thresholds tau to try.
    #[arg(long, value_delimiter = ',',
          default_values_t = [0.2, 0.3, 0.35, 0.4, 0.45, 0.46, 0.5, 0.6, 0.7, 0.85])]
    taus: Vec<f64>,
    /// Launch encodings to compare (what each launch is shingled as).
    #[arg(long, value_enum, value_delimiter = ',',
          default_values_t = [Elements::Named, Elements::NameFree, Elements::Both, Elements::NameFreeCarried,
                             Elements::NameFreeExact])]
    elements: Vec<Elements>,
    /// Number of MinHash functions k.
    #[arg(long, default_value_t = DEFAULT_NUM_HASHES)]
    k: usize,
    /// Most representatives a class of the simulated aggregator adds from its members
    /// [default: the aggregator's].
    #[arg(long, default_value_t = penrose_aggregator::tables::MAX_REPRESENTATIVES)]
    reps: usize,
    /// A joining window becomes a representative while its best similarity is below
    /// tau + novelty (1 - tau) [default: the aggregator's; 1 takes every member while room].
    #[arg(long, default_value_t = penrose_aggregator::tables::NOVELTY)]
    novelty: f64,
    /// Whether a window that matches two classes joins them [default: the aggregator's].
    #[arg(long, default_value_t = penrose_aggregator::tables::MERGE_CLASSES,
          action = clap::ArgAction::Set)]
    merge: bool,
    /// Where to write the report; `-` writes nothing.
    #[arg(long, default_value = "docs/evaluation.md")]
    out: PathBuf,
    /// Print the results as JSON on stdout.
    #[arg(long)]
    json: bool,
}

impl Args {
    fn rule(&self) -> cluster::Rule {
        cluster::Rule {
            max_reps: self.reps.max(1),
            novelty: self.novelty,
            merge: self.merge,
        }
    }
}

/// What a snippet is summarised into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Encoding {
    /// Set MinHash packed into the 256-bit snippet hash (b-bit).
    Set256,
    /// Set MinHash with the full 64-bit values.
    Set64,
    /// Weighted MinHash over shingle counts, 256-bit snippet hash.
    Weighted256,
    /// Weighted MinHash with the full 64-bit values.
    Weighted64,
}

impl Encoding {
    const ALL: [Self; 4] = [
        Self::Set256,
        Self::Set64,
        Self::Weighted256,
        Self::Weighted64,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Set256 => "set, 256-bit",
            Self::Set64 => "set, 64-bit values",
            Self::Weighted256 => "weighted, 256-bit",
            Self::Weighted64 => "weighted, 64-bit values",
        }
    }
}

/// Medians of exact Jaccard similarities in one cell.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Exact {
    /// Perturbed window vs the same window unperturbed (same offset), set Jaccard.
    pub own_set: f64,
    /// The same pairs, weighted.
    pub own_weighted: f64,
    /// Perturbed window vs an unperturbed window of the same sequence, set Jaccard.
    pub same_set: f64,
    /// The same pairs, weighted Jaccard over shingle counts.
    pub same_weighted: f64,
    /// Two independently perturbed windows of the same sequence, set Jaccard.
    pub both_set: f64,
    /// The same pairs, weighted.
    pub both_weighted: f64,
    /// Perturbed window vs an unperturbed window of another application, set Jaccard.
    pub other_set: f64,
    /// The same pairs, weighted.
    pub other_weighted: f64,
}

/// One (mode, elements, L, p, n) cell.
#[derive(Clone, Debug, Serialize)]
pub struct Cell {
    mode: Mode,
    elements: Elements,
    len: usize,
    p: f64,
    n: usize,
    windows: usize,
    exact: Exact,
    scores: Vec<EncodingScore>,
    /// The shipped encoding at the shipped tau under simpler class rules, to measure what
    /// healing gains.
    healing: Vec<HealingScore>,
    /// The shipped encoding, tau and class rule: per file label (per process: the index of
    /// the per-process sequence), its windows in their own class and its windows.
    own_by_file: Vec<[usize; 2]>,
}

/// The shipped encoding and tau under one class rule.
#[derive(Clone, Debug, Serialize)]
pub struct HealingScore {
    rule: cluster::Rule,
    score: Score,
    score_by_file: Score,
}

/// The score of one encoding at one tau.
#[derive(Clone, Debug, Serialize)]
pub struct EncodingScore {
    encoding: Encoding,
    tau: f64,
    score: Score,
    /// The score when every file counts as its own application.
    score_by_file: Score,
}

/// Everything measured.
#[derive(Debug, Serialize)]
pub struct Evaluation {
    traces: String,
    seed: u64,
    windows_per_sequence: usize,
    k: usize,
    rule: cluster::Rule,
    applications: Vec<String>,
    process_sequences: Vec<(String, usize)>,
    stream_sequences: Vec<(String, usize)>,
    kernels: usize,
    kernels_without_config: usize,
    distinct_names: usize,
    distinct_configs: usize,
    /// Files of one job (ranks), pairwise: weighted Jaccard of their whole launch sequences'
    /// n-grams, for n = 1 and the shipped n.
    ranks: Vec<RankSimilarity>,
    cells: Vec<Cell>,
    /// Per process, graph launches expanded into their kernels or not (issue 24).
    graphs: graphs::GraphEval,
}

/// How alike two ranks of one job are.
#[derive(Clone, Debug, Serialize)]
pub struct RankSimilarity {
    files: (String, String),
    /// Weighted Jaccard of kernel multisets (1-grams).
    kernels: f64,
    /// Weighted Jaccard of the shipped n-grams.
    ngrams: f64,
    /// The same between the two halves of the first file, for scale.
    halves: f64,
}

/// Weighted Jaccard (Σ min / Σ max) of the n-gram counts of two sequences.
fn ngram_jaccard(a: &[LaunchId], b: &[LaunchId], n: usize) -> f64 {
    let mut counts: std::collections::HashMap<&[LaunchId], (u64, u64)> =
        std::collections::HashMap::new();
    for w in a.windows(n) {
        counts.entry(w).or_default().0 += 1;
    }
    for w in b.windows(n) {
        counts.entry(w).or_default().1 += 1;
    }
    let (min, max) = counts
        .values()
        .fold((0, 0), |(lo, hi), &(x, y)| (lo + x.min(y), hi + x.max(y)));
    if max == 0 {
        0.0
    } else {
        min as f64 / max as f64
    }
}

/// Every pair of files of one job.
fn rank_similarities(corpus: &Corpus) -> Vec<RankSimilarity> {
    let mut out = Vec::new();
    for (i, a) in corpus.process.iter().enumerate() {
        for b in &corpus.process[i + 1..] {
            if a.app != b.app {
                continue;
            }
            let half = a.seq.len() / 2;
            out.push(RankSimilarity {
                files: (a.file.clone(), b.file.clone()),
                kernels: ngram_jaccard(&a.seq, &b.seq, 1),
                ngrams: ngram_jaccard(&a.seq, &b.seq, DEFAULT_NGRAM_LEN),
                halves: ngram_jaccard(&a.seq[..half], &a.seq[half..], DEFAULT_NGRAM_LEN),
            });
        }
    }
    out
}

/// Runs the evaluation.
pub fn run(mut args: Args) -> anyhow::Result<()> {
    complete(&mut args)?;
    let dir = args
        .traces
        .clone()
        .unwrap_or_else(penrose_traces::TraceFolder::default_dir);
    eprintln!(
        "eval-fingerprints: traces {}, seed {}, {} windows per (sequence, L, p){}",
        dir.display(),
        args.seed,
        args.windows,
        if cfg!(debug_assertions) {
            " (debug build: `cargo run --release -p xtask -- eval-fingerprints` is ~10x faster)"
        } else {
            ""
        }
    );
    let corpus =
        Corpus::read(&dir).with_context(|| format!("reading traces in {}", dir.display()))?;
    let mut cells = grid_cells(&corpus, &args)?;
    let graphs = graphs::evaluate(&corpus, &args)?;
    sort_cells(&mut cells, &args.elements);
    let eval = evaluation(&dir, &args, &corpus, cells, graphs);
    let markdown = report::render(&eval, &args);
    if args.out.as_os_str() != "-" {
        write_report(&args.out, markdown)?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&eval)?);
    } else {
        println!("{}", report::summary(&eval, &args));
    }
    Ok(())
}

/// Adds the shipped defaults to what is measured, so the report can place them, and names,
/// the reference every other encoding is set against; then checks the arguments.
fn complete(args: &mut Args) -> anyhow::Result<()> {
    if !args.taus.contains(&DEFAULT_TAU) {
        args.taus.push(DEFAULT_TAU);
    }
    args.taus.sort_by(f64::total_cmp);
    if !args.ngrams.contains(&DEFAULT_NGRAM_LEN) {
        args.ngrams.push(DEFAULT_NGRAM_LEN);
    }
    if !args.elements.contains(&Elements::Named) {
        args.elements.insert(0, Elements::Named);
    }
    args.elements.dedup();
    anyhow::ensure!(args.windows >= 2, "--windows must be at least 2");
    anyhow::ensure!(
        (1..=256).contains(&args.k),
        "--k must lie in 1..=256 (it must fit the 256-bit hash)"
    );
    Ok(())
}

/// The cells of every (mode, L, p) job, every launch encoding and n, on every core.
fn grid_cells(corpus: &Corpus, args: &Args) -> anyhow::Result<Vec<Cell>> {
    let foreign = foreign(corpus);
    let jobs = jobs(args);
    let bar = progress_bar((jobs.len() * args.ngrams.len() * args.elements.len()) as u64);
    let cells = parallel(&jobs, |&(i, (mode, len, p))| {
        let seed = job_seed(args.seed, i);
        run_job(corpus, &foreign, args, mode, len, p, seed, &bar)
    })?;
    bar.finish_and_clear();
    Ok(cells)
}

/// The report's order: mode, launch encoding (as given), n, L, p.
fn sort_cells(cells: &mut [Cell], elements: &[Elements]) {
    let elements_rank = |t: Elements| elements.iter().position(|&x| x == t);
    cells.sort_by(|a, b| {
        (a.mode as u8, elements_rank(a.elements), a.n, a.len)
            .cmp(&(b.mode as u8, elements_rank(b.elements), b.n, b.len))
            .then(a.p.total_cmp(&b.p))
    });
}

fn evaluation(
    dir: &std::path::Path,
    args: &Args,
    corpus: &Corpus,
    cells: Vec<Cell>,
    graphs: graphs::GraphEval,
) -> Evaluation {
    let sequences = |mode| {
        corpus
            .sources(mode)
            .iter()
            .map(|s| (s.file.clone(), s.seq.len()))
            .collect()
    };
    Evaluation {
        traces: traces_label(dir),
        seed: args.seed,
        windows_per_sequence: args.windows,
        k: args.k,
        rule: args.rule(),
        applications: corpus.apps.clone(),
        process_sequences: sequences(Mode::Process),
        stream_sequences: sequences(Mode::Stream),
        kernels: corpus.kernels,
        kernels_without_config: corpus.kernels_without_config,
        distinct_names: corpus.digests.len(),
        distinct_configs: corpus.configs.len(),
        ranks: rank_similarities(corpus),
        cells,
        graphs,
    }
}

/// Writes the report to `out`, keeping the hand-written sections after the marker of the
/// report already there.
fn write_report(out: &std::path::Path, markdown: String) -> anyhow::Result<()> {
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    let kept = std::fs::read_to_string(out).ok().and_then(|old| {
        old.find(report::HAND_WRITTEN)
            .map(|at| old[at..].to_owned())
    });
    let markdown = match kept {
        Some(tail) => format!("{markdown}\n{tail}"),
        None => markdown,
    };
    std::fs::write(out, &markdown).with_context(|| format!("writing {}", out.display()))?;
    eprintln!("wrote {}", out.display());
    Ok(())
}

/// Every application's foreign kernels: the launches of all other applications' processes.
fn foreign(corpus: &Corpus) -> Vec<Vec<LaunchId>> {
    (0..corpus.apps.len())
        .map(|app| {
            corpus
                .process
                .iter()
                .filter(|s| s.app != app)
                .flat_map(|s| s.seq.iter().copied())
                .collect()
        })
        .collect()
}

/// Every (mode, L, p) of the grid, numbered in the order that seeds them ([`job_seed`]),
/// longest windows first so the workers finish together.
fn jobs(args: &Args) -> Vec<(usize, (Mode, usize, f64))> {
    let mut jobs = Vec::new();
    for mode in [Mode::Process, Mode::Stream] {
        for &len in &args.lengths {
            for &p in &args.perturb {
                jobs.push((mode, len, p));
            }
        }
    }
    jobs.sort_by_key(|job| std::cmp::Reverse(job.1));
    jobs.into_iter().enumerate().collect()
}

/// The seed of job `i` of [`jobs`].
fn job_seed(seed: u64, i: usize) -> u64 {
    seed ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

fn progress_bar(len: u64) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} cells {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

/// The cells of every job, one worker per core.
fn parallel<J: Sync>(
    jobs: &[J],
    run: impl Fn(&J) -> Vec<Cell> + Sync,
) -> anyhow::Result<Vec<Cell>> {
    let next = AtomicUsize::new(0);
    let cells = Mutex::new(Vec::new());
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                while let Some(job) = jobs.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let out = run(job);
                    if let Ok(mut cells) = cells.lock() {
                        cells.extend(out);
                    }
                }
            });
        }
    });
    cells
        .into_inner()
        .map_err(|_| anyhow::anyhow!("a worker panicked"))
}

/// How the report names the trace folder: the project's layout (`../shared/traces`) when it
/// is that folder, so the document holds no machine's path; else the path as given.
fn traces_label(dir: &std::path::Path) -> String {
    let canonical = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    if canonical.ends_with("shared/traces") {
        "../shared/traces".to_owned()
    } else {
        dir.display().to_string()
    }
}

/// One window's fingerprints in every encoding.
struct Fingerprints {
    set: MinHashSignature,
    weighted: MinHashSignature,
    set256: SnippetHash,
    weighted256: SnippetHash,
}

#[allow(clippy::too_many_arguments)]
fn run_job(
    corpus: &Corpus,
    foreign: &[Vec<u32>],
    args: &Args,
    mode: Mode,
    len: usize,
    p: f64,
    seed: u64,
    bar: &ProgressBar,
) -> Vec<Cell> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let sources = corpus.sources(mode);
    let job = JobWindows::draw(sources, foreign, args.windows, len, p, seed, &mut rng);
    let labels: Vec<usize> = job.drawn.iter().map(|w| sources[w.0].label).collect();
    let file_labels: Vec<usize> = job.drawn.iter().map(|w| sources[w.0].file_label).collect();
    let apps: Vec<usize> = job.drawn.iter().map(|w| sources[w.0].app).collect();
    let mut order: Vec<usize> = (0..job.drawn.len()).collect();
    order.shuffle(&mut rng);
    let hasher = MinHasher::new(args.k);

    let mut cells = Vec::new();
    for &elements in &args.elements {
        let mut writer = ElementWriter::new(corpus, elements);
        let written = job.elements_of(&mut writer, elements, sources);
        for &n in &args.ngrams {
            bar.set_message(format!("{mode:?} {elements:?} L={len} p={p} n={n}"));
            let params = FingerprintParams {
                ngram_len: n,
                num_hashes: args.k,
                ..FingerprintParams::default()
            };
            let mut shingler = windows::Shingler::new(n, &writer.digests);
            let keys: Vec<_> = written.iter().map(|w| shingler.keys(&w[0])).collect();
            let clean_keys: Vec<_> = written.iter().map(|w| shingler.keys(&w[1])).collect();
            let unperturbed_keys: Vec<_> = written.iter().map(|w| shingler.keys(&w[2])).collect();
            cells.push(score_cell(
                args,
                &job.drawn,
                &order,
                &labels,
                &file_labels,
                &apps,
                &hasher,
                &params,
                mode,
                elements,
                len,
                p,
                &keys,
                &clean_keys,
                &unperturbed_keys,
            ));
            bar.inc(1);
        }
    }
    cells
}

/// One job's windows, drawn once for every launch encoding.
struct JobWindows {
    /// Each window (see [`Drawn`]).
    drawn: Vec<Drawn>,
    /// The offsets of each drawn window's perturbed (and unperturbed) and clean windows.
    offsets: Vec<(usize, usize)>,
    /// What the agent saw before each window when its probes were detached in between
    /// (`Elements::NameFreeSeen`): the process's previous window, L launches ending at an
    /// independent offset, for the perturbed and the clean window.
    previous: Vec<(Vec<LaunchId>, Vec<LaunchId>)>,
}

impl JobWindows {
    /// `per_source` windows of `len` launches from each source, a share `p` of them
    /// perturbed with `foreign` launches of other applications.
    fn draw(
        sources: &[Source],
        foreign: &[Vec<u32>],
        per_source: usize,
        len: usize,
        p: f64,
        seed: u64,
        rng: &mut ChaCha8Rng,
    ) -> Self {
        let mut drawn = Vec::new();
        let mut offsets = Vec::new();
        for (si, source) in sources.iter().enumerate() {
            for _ in 0..per_source {
                let offset = rng.random_range(0..source.seq.len().max(1));
                let perturbed =
                    windows::draw_at(&source.seq, offset, len, p, &foreign[source.app], rng);
                let (clean_offset, clean) = windows::draw(&source.seq, len, 0.0, &[], rng);
                let unperturbed = windows::draw_at(&source.seq, offset, len, 0.0, &[], rng);
                drawn.push((si, perturbed, clean, unperturbed));
                offsets.push((offset, clean_offset));
            }
        }
        // Drawn from their own generator, so that adding this encoding left every other
        // encoding's windows as they were.
        let mut seen_rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5345_454e_5345_454e);
        let previous = drawn
            .iter()
            .map(|w| {
                let seq = &sources[w.0].seq;
                let mut one = || {
                    let offset = seen_rng.random_range(0..seq.len().max(1));
                    windows::draw_at(seq, offset, len, 0.0, &[], &mut seen_rng)
                };
                (one(), one())
            })
            .collect();
        Self {
            drawn,
            offsets,
            previous,
        }
    }

    /// Each window as `elements`: the perturbed, the clean and the unperturbed one, each with
    /// the history its encoding sees.
    fn elements_of(
        &self,
        writer: &mut ElementWriter,
        elements: Elements,
        sources: &[Source],
    ) -> Vec<[Vec<u32>; 3]> {
        self.drawn
            .iter()
            .zip(&self.offsets)
            .zip(&self.previous)
            .map(|((w, &(offset, clean_offset)), seen)| {
                let seq = &sources[w.0].seq;
                let (before, before_clean) = match elements {
                    Elements::NameFreeSeen => seen.clone(),
                    _ if writer.needs_history() => {
                        (history(seq, offset), history(seq, clean_offset))
                    }
                    _ => (Vec::new(), Vec::new()),
                };
                [
                    writer.elements_of(&w.1, &before),
                    writer.elements_of(&w.2, &before_clean),
                    writer.elements_of(&w.3, &before),
                ]
            })
            .collect()
    }
}

/// The launches an agent saw in the process before a window at `offset`: one loop of the
/// sequence, at most as far back as the largest gap bucket reaches.
fn history(seq: &[LaunchId], offset: usize) -> Vec<LaunchId> {
    let h = seq.len().min(1 << (MAX_GAP_BUCKET - 1));
    (0..h)
        .map(|i| seq[(offset + seq.len() - h + i) % seq.len()])
        .collect()
}

/// Fingerprints one cell's windows in every encoding and scores the classes they form.
#[allow(clippy::too_many_arguments)]
fn score_cell(
    args: &Args,
    drawn: &[Drawn],
    order: &[usize],
    labels: &[usize],
    file_labels: &[usize],
    apps: &[usize],
    hasher: &MinHasher,
    params: &FingerprintParams,
    mode: Mode,
    elements: Elements,
    len: usize,
    p: f64,
    keys: &[Vec<ShingleKey>],
    clean_keys: &[Vec<ShingleKey>],
    unperturbed_keys: &[Vec<ShingleKey>],
) -> Cell {
    let bits = params.bits_per_value();
    let prints: Vec<Fingerprints> = keys
        .iter()
        .map(|k| {
            let set = hasher.signature(k, Weighting::Set);
            let weighted = hasher.signature(k, Weighting::Counts);
            Fingerprints {
                set256: SnippetHash::from_signature(&set, bits),
                weighted256: SnippetHash::from_signature(&weighted, bits),
                set,
                weighted,
            }
        })
        .collect();
    let exact = exact_medians(drawn, apps, keys, clean_keys, unperturbed_keys);
    let mut scores = Vec::new();
    let mut healing = (Vec::new(), Vec::new());
    for encoding in Encoding::ALL {
        let sim = SimMatrix::new(prints.len(), |i, j| {
            let (a, b) = (&prints[i], &prints[j]);
            match encoding {
                Encoding::Set256 => a.set256.estimate_jaccard(&b.set256, params),
                Encoding::Set64 => a.set.similarity(&b.set),
                Encoding::Weighted256 => a.weighted256.estimate_jaccard(&b.weighted256, params),
                Encoding::Weighted64 => a.weighted.similarity(&b.weighted),
            }
        });
        for &tau in &args.taus {
            let class_of = cluster::online(order, &sim, tau, args.rule());
            scores.push(EncodingScore {
                encoding,
                tau,
                score: cluster::score(&class_of, labels, apps),
                score_by_file: cluster::score(&class_of, file_labels, apps),
            });
        }
        if encoding == Encoding::Weighted256 {
            healing = healing_scores(args.rule(), order, &sim, labels, file_labels, apps);
        }
    }
    let (healing, own_by_file) = healing;
    Cell {
        mode,
        elements,
        len,
        p,
        n: params.ngram_len,
        windows: drawn.len(),
        exact,
        scores,
        healing,
        own_by_file,
    }
}

/// The shipped encoding's windows at the shipped tau under the shipped class rule and two
/// simpler ones (one representative without merging; without merging), and under the shipped
/// rule each file label's windows in their own class.
fn healing_scores(
    shipped: cluster::Rule,
    order: &[usize],
    sim: &SimMatrix,
    labels: &[usize],
    file_labels: &[usize],
    apps: &[usize],
) -> (Vec<HealingScore>, Vec<[usize; 2]>) {
    let simpler = [
        cluster::Rule {
            max_reps: 1,
            merge: false,
            ..shipped
        },
        cluster::Rule {
            merge: false,
            ..shipped
        },
    ];
    let mut healing = Vec::new();
    for rule in simpler {
        let class_of = cluster::online(order, sim, DEFAULT_TAU, rule);
        healing.push(HealingScore {
            rule,
            score: cluster::score(&class_of, labels, apps),
            score_by_file: cluster::score(&class_of, file_labels, apps),
        });
    }
    let class_of = cluster::online(order, sim, DEFAULT_TAU, shipped);
    healing.push(HealingScore {
        rule: shipped,
        score: cluster::score(&class_of, labels, apps),
        score_by_file: cluster::score(&class_of, file_labels, apps),
    });
    (healing, cluster::own_class_by_label(&class_of, file_labels))
}

/// A window: its source, the perturbed window, an unperturbed window at an independent offset,
/// and the unperturbed window at the same offset.
type Drawn = (usize, Vec<LaunchId>, Vec<LaunchId>, Vec<LaunchId>);

fn exact_medians(
    drawn: &[Drawn],
    apps: &[usize],
    keys: &[Vec<ShingleKey>],
    clean_keys: &[Vec<ShingleKey>],
    unperturbed_keys: &[Vec<ShingleKey>],
) -> Exact {
    let (mut same, mut both, mut other, mut own) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..drawn.len() {
        own.push(windows::exact_jaccard(&keys[i], &unperturbed_keys[i]));
        same.push(windows::exact_jaccard(&keys[i], &clean_keys[i]));
        if let Some(j) = (i + 1..drawn.len()).find(|&j| drawn[j].0 == drawn[i].0) {
            both.push(windows::exact_jaccard(&keys[i], &keys[j]));
        }
        if let Some(j) = (1..drawn.len())
            .map(|d| (i + d) % drawn.len())
            .find(|&j| apps[j] != apps[i])
        {
            other.push(windows::exact_jaccard(&keys[i], &clean_keys[j]));
        }
    }
    let median = |v: &[(f64, f64)], pick: fn(&(f64, f64)) -> f64| {
        let mut x: Vec<f64> = v.iter().map(pick).collect();
        x.sort_by(f64::total_cmp);
        x.get(x.len() / 2).copied().unwrap_or(f64::NAN)
    };
    Exact {
        own_set: median(&own, |x| x.0),
        own_weighted: median(&own, |x| x.1),
        same_set: median(&same, |x| x.0),
        same_weighted: median(&same, |x| x.1),
        both_set: median(&both, |x| x.0),
        both_weighted: median(&both, |x| x.1),
        other_set: median(&other, |x| x.0),
        other_weighted: median(&other, |x| x.1),
    }
}
