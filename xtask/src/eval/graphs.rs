//! CUDA graph launches (issue 24), seen the ways the agent can see them: expanded into the
//! graph's kernels (a launch of a graph whose construction the agent saw: stream capture or
//! the explicit graph API), or as one `<graph>` element per launch (every graph launch before
//! issue 24, and still a launch of a graph built before the agent attached).
//!
//! Each view is scored at the shipped configuration (per process, names, n = 4, the 256-bit
//! hash, tau and the class rule), with the windows, perturbations and arrival order the main
//! grid draws for the same (L, p): the expanded view reproduces its figures.

use std::collections::{HashMap, HashSet};
use std::fmt::Write;
use std::hash::Hash;

use penrose_core::fingerprint::{DEFAULT_NGRAM_LEN, DEFAULT_TAU, LaunchConfig, NameDigest};
use serde::Serialize;

use super::corpus::{ConfigId, Corpus, LaunchId, Mode, NameId, Source};
use super::elements::Elements;
use super::{Args, Cell};

/// What a graph launch is in a snippet when the agent does not expand it
/// (`penrose_agent::capture::window::GRAPH`).
pub const GRAPH: &str = "<graph>";

/// How graph launches enter the snippets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum GraphView {
    /// Each graph launch as its kernels in launch order (the agent saw every graph built):
    /// the per-process sequences the rest of the evaluation uses.
    Expanded,
    /// Each graph launch as one `<graph>` element at its first kernel's position (the agent
    /// before issue 24, or one that attached after every graph was built).
    NotExpanded,
    /// Half of each process's windows expanded, half not, clustered together: a fleet where
    /// some agents saw the graphs built and others attached later. Its windows are drawn
    /// from two copies of each process, half as many from each, which for a process without
    /// graph launches are the very windows the other views draw (the generator is consumed
    /// the same way).
    Mixed,
}

impl GraphView {
    /// Every view, in report order.
    pub const ALL: [Self; 3] = [Self::Expanded, Self::NotExpanded, Self::Mixed];

    /// The label in the report.
    pub fn label(self) -> &'static str {
        match self {
            Self::Expanded => "expanded (agent as built)",
            Self::NotExpanded => "not expanded (`<graph>`, agent before)",
            Self::Mixed => "mixed (half the windows each way)",
        }
    }
}

/// One sequence with every graph launch (a distinct key in `graph`, given per launch of
/// `seq`) replaced by `element` at the position of its first kernel; the launch's other
/// kernels are left out, kernels launched on their own are kept.
pub fn collapse<K: Eq + Hash + Copy>(
    seq: &[LaunchId],
    graph: &[Option<K>],
    element: LaunchId,
) -> Vec<LaunchId> {
    let mut seen = HashSet::new();
    seq.iter()
        .zip(graph)
        .filter_map(|(&launch, key)| match key {
            None => Some(launch),
            Some(key) => seen.insert(*key).then_some(element),
        })
        .collect()
}

/// How many of a process's launches were graph launches, and what leaving them unexpanded
/// takes out of its sequence.
#[derive(Clone, Debug, Serialize)]
pub struct GraphCounts {
    /// The trace file.
    pub file: String,
    /// Kernels of the process.
    pub kernels: usize,
    /// Of those, kernels a graph launch launched.
    pub graph_kernels: usize,
    /// Launch calls: kernels launched on their own plus graph launches (the length of the
    /// sequence with graphs not expanded).
    pub launches: usize,
    /// Of those, graph launches.
    pub graph_launches: usize,
    /// Graph launches told apart by their kernel sequences.
    pub distinct_graphs: usize,
    /// Kernel names that occur only inside graph launches: no snippet of this process holds
    /// them when graphs are not expanded.
    pub names_only_in_graphs: usize,
    /// Weighted Jaccard of the whole sequence's shipped n-grams, expanded against not.
    pub ngram_jaccard: f64,
    /// Per window length L: the median of the same over stretches of L kernels of the looped
    /// sequence at evenly spaced offsets (the same launches, expanded against not).
    pub stretch_jaccard: Vec<(usize, f64)>,
}

/// The counts of one per-process source, with [`GraphCounts::stretch_jaccard`] over
/// `windows` stretches of each length in `lengths`.
pub fn counts(corpus: &Corpus, source: &Source, lengths: &[usize], windows: usize) -> GraphCounts {
    let element = corpus.launches.len() as LaunchId;
    let collapsed = collapse(&source.seq, &source.graph, element);
    let mut graphs: HashMap<i64, Vec<LaunchId>> = HashMap::new();
    let (mut inside, mut outside) = (HashSet::new(), HashSet::new());
    for (&launch, key) in source.seq.iter().zip(&source.graph) {
        let name: NameId = corpus.launches[launch as usize].0;
        match key {
            Some(key) => {
                graphs.entry(*key).or_default().push(launch);
                inside.insert(name);
            }
            None => {
                outside.insert(name);
            }
        }
    }
    GraphCounts {
        file: source.file.clone(),
        kernels: source.seq.len(),
        graph_kernels: source.graph.iter().flatten().count(),
        launches: collapsed.len(),
        graph_launches: graphs.len(),
        distinct_graphs: graphs.values().collect::<HashSet<_>>().len(),
        names_only_in_graphs: inside.difference(&outside).count(),
        ngram_jaccard: super::ngram_jaccard(&source.seq, &collapsed, DEFAULT_NGRAM_LEN),
        stretch_jaccard: lengths
            .iter()
            .map(|&len| (len, stretch_jaccard(source, element, len, windows)))
            .collect(),
    }
}

/// The median n-gram Jaccard of `windows` stretches of `len` kernels, expanded against not.
/// A stretch longer than the sequence loops it; each pass's graph launches are launches of
/// their own.
fn stretch_jaccard(source: &Source, element: LaunchId, len: usize, windows: usize) -> f64 {
    let n = source.seq.len();
    let mut medians: Vec<f64> = (0..windows.max(1))
        .map(|i| {
            let at = i * n / windows.max(1);
            let seq: Vec<LaunchId> = (at..at + len).map(|j| source.seq[j % n]).collect();
            let graph: Vec<Option<(usize, i64)>> = (at..at + len)
                .map(|j| source.graph[j % n].map(|key| (j / n, key)))
                .collect();
            super::ngram_jaccard(&seq, &collapse(&seq, &graph, element), DEFAULT_NGRAM_LEN)
        })
        .collect();
    medians.sort_by(f64::total_cmp);
    medians.get(medians.len() / 2).copied().unwrap_or(1.0)
}

/// The corpus a view's windows are drawn from: the per-process sources only, and `<graph>`
/// as one more launch (name and an all-zero configuration) after the corpus's own.
pub fn view_corpus(corpus: &Corpus, view: GraphView) -> Corpus {
    let element = corpus.launches.len() as LaunchId;
    let (mut digests, mut configs, mut launches) = (
        corpus.digests.clone(),
        corpus.configs.clone(),
        corpus.launches.clone(),
    );
    digests.push(NameDigest::of(GRAPH));
    configs.push(LaunchConfig::default());
    launches.push((
        (digests.len() - 1) as NameId,
        (configs.len() - 1) as ConfigId,
    ));
    let collapsed = |s: &Source| Source {
        seq: collapse(&s.seq, &s.graph, element),
        graph: Vec::new(),
        ..s.clone()
    };
    let process = match view {
        GraphView::Expanded => corpus.process.clone(),
        GraphView::NotExpanded => corpus.process.iter().map(collapsed).collect(),
        GraphView::Mixed => corpus
            .process
            .iter()
            .flat_map(|s| [s.clone(), collapsed(s)])
            .collect(),
    };
    Corpus {
        apps: corpus.apps.clone(),
        process,
        stream: Vec::new(),
        digests,
        launches,
        configs,
        kernels: corpus.kernels,
        kernels_without_config: corpus.kernels_without_config,
    }
}

/// One view scored over the (L, p) grid.
#[derive(Debug, Serialize)]
pub struct ViewCells {
    view: GraphView,
    /// Windows drawn per source (half the grid's for [`GraphView::Mixed`], whose sources
    /// are two copies of each process).
    windows_per_source: usize,
    /// Per (L, p), sorted by L then p.
    cells: Vec<Cell>,
}

/// The graph views of the traces.
#[derive(Debug, Serialize)]
pub struct GraphEval {
    /// Per process, in the order of the per-process sequences.
    processes: Vec<GraphCounts>,
    /// Each view at the shipped configuration.
    views: Vec<ViewCells>,
}

/// Scores every view at the shipped configuration, per process, over the grid's (L, p).
pub fn evaluate(corpus: &Corpus, args: &Args) -> anyhow::Result<GraphEval> {
    // The main grid's job numbers seed the same windows for the same (L, p).
    let grid: Vec<(usize, usize, f64)> = super::jobs(args)
        .into_iter()
        .filter(|(_, job)| job.0 == Mode::Process)
        .map(|(i, (_, len, p))| (i, len, p))
        .collect();
    // Every view perturbs with the same foreign kernels (graphs expanded), so that a process
    // without graph launches gets the same windows in the expanded and not-expanded views.
    let foreign = super::foreign(corpus);
    let bar = super::progress_bar((grid.len() * GraphView::ALL.len()) as u64);
    let mut views = Vec::new();
    for view in GraphView::ALL {
        let corpus = view_corpus(corpus, view);
        let args = shipped_args(args, view);
        let mut cells = super::parallel(&grid, |&(i, len, p)| {
            let seed = super::job_seed(args.seed, i);
            super::run_job(&corpus, &foreign, &args, Mode::Process, len, p, seed, &bar)
        })?;
        cells.sort_by(|a, b| a.len.cmp(&b.len).then(a.p.total_cmp(&b.p)));
        views.push(ViewCells {
            view,
            windows_per_source: args.windows,
            cells,
        });
    }
    bar.finish_and_clear();
    let processes = corpus
        .process
        .iter()
        .map(|s| counts(corpus, s, &args.lengths, args.windows))
        .collect();
    Ok(GraphEval { processes, views })
}

/// The arguments of one view's runs: names, the shipped n and tau.
fn shipped_args(args: &Args, view: GraphView) -> Args {
    let windows = match view {
        GraphView::Mixed => (args.windows / 2).max(1),
        _ => args.windows,
    };
    Args {
        elements: vec![Elements::Named],
        ngrams: vec![DEFAULT_NGRAM_LEN],
        taus: vec![DEFAULT_TAU],
        windows,
        ..args.clone()
    }
}

/// A view's figures, averaged over its (L, p) cells.
struct ViewSummary {
    own: (f64, f64),
    own_by_file: (f64, f64),
    max_mixed: f64,
    classes: f64,
    /// Per process: windows in their own class, and windows, over all cells.
    by_process: Vec<[usize; 2]>,
}

fn summarise(view: &ViewCells) -> ViewSummary {
    let enc = super::report::default_encoding();
    let scores: Vec<_> = view
        .cells
        .iter()
        .filter_map(|c| {
            let s = c.scores.iter().find(|s| s.encoding == enc)?;
            Some((s, &c.own_by_file))
        })
        .collect();
    let stat = |f: &dyn Fn(&super::EncodingScore) -> f64| {
        let v: Vec<f64> = scores.iter().map(|(s, _)| f(s)).collect();
        let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
        (mean, v.iter().copied().fold(f64::INFINITY, f64::min))
    };
    let mut by_process: Vec<[usize; 2]> = Vec::new();
    for (_, own) in &scores {
        by_process.resize(by_process.len().max(own.len()), [0, 0]);
        for (sum, x) in by_process.iter_mut().zip(own.iter()) {
            sum[0] += x[0];
            sum[1] += x[1];
        }
    }
    ViewSummary {
        own: stat(&|s| s.score.own_class),
        own_by_file: stat(&|s| s.score_by_file.own_class),
        max_mixed: scores
            .iter()
            .map(|(s, _)| s.score.mixed_classes)
            .fold(0.0, f64::max),
        classes: stat(&|s| s.score.classes as f64).0,
        by_process,
    }
}

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

fn share(x: [usize; 2]) -> String {
    if x[1] == 0 {
        "-".to_owned()
    } else {
        format!("{} ({}/{})", pct(x[0] as f64 / x[1] as f64), x[0], x[1])
    }
}

/// The views side by side: one row per view.
fn views_table(g: &GraphEval) -> String {
    let mut w = String::from(
        "| view | own class, job (mean / min) | own class, per file (mean / min) | mixed classes (max) | classes (mean) |\n|---|---|---|---|---|\n",
    );
    for v in &g.views {
        let s = summarise(v);
        let _ = writeln!(
            w,
            "| {} | {} / {} | {} / {} | {} | {:.1} |",
            v.view.label(),
            pct(s.own.0),
            pct(s.own.1),
            pct(s.own_by_file.0),
            pct(s.own_by_file.1),
            pct(s.max_mixed),
            s.classes
        );
    }
    w
}

/// Per process: its graph launches and its own-class share (per file) in each view.
fn processes_table(g: &GraphEval) -> String {
    let mut w = String::from(
        "| process (file) | kernels | graph kernels | launches | graph launches | distinct graphs | names only in graphs | 4-gram Jaccard, expanded vs not: whole run; per L (median) |",
    );
    let summaries: Vec<ViewSummary> = g.views.iter().map(summarise).collect();
    for v in &g.views {
        let _ = write!(w, " own class, {} |", v.view.label());
    }
    w.push_str("\n|---|---|---|---|---|---|---|---|");
    w.push_str(&"---|".repeat(g.views.len()));
    w.push('\n');
    for (i, c) in g.processes.iter().enumerate() {
        let stretches: Vec<String> = c
            .stretch_jaccard
            .iter()
            .map(|(len, j)| format!("{len}: {j:.3}"))
            .collect();
        let _ = write!(
            w,
            "| `{}` | {} | {} | {} | {} | {} | {} | {:.3}; {} |",
            c.file,
            c.kernels,
            c.graph_kernels,
            c.launches,
            c.graph_launches,
            c.distinct_graphs,
            c.names_only_in_graphs,
            c.ngram_jaccard,
            stretches.join(", ")
        );
        for s in &summaries {
            let _ = write!(
                w,
                " {} |",
                share(s.by_process.get(i).copied().unwrap_or([0, 0]))
            );
        }
        w.push('\n');
    }
    w
}

/// Per (L, p): own class per file / mixed classes in each view, and the own-class share of
/// each process with graph launches.
fn cells_table(g: &GraphEval) -> String {
    let enc = super::report::default_encoding();
    let graphed: Vec<usize> = (0..g.processes.len())
        .filter(|&i| g.processes[i].graph_launches > 0)
        .collect();
    let mut w = String::from("| L | p |");
    for v in &g.views {
        let _ = write!(w, " {}: per file / mixed |", v.view.label());
        for &i in &graphed {
            let _ = write!(w, " `{}` |", g.processes[i].file);
        }
    }
    w.push_str("\n|---|---|");
    w.push_str(&"---|".repeat(g.views.len() * (1 + graphed.len())));
    w.push('\n');
    let Some(first) = g.views.first() else {
        return w;
    };
    for (k, cell) in first.cells.iter().enumerate() {
        let _ = write!(w, "| {} | {} |", cell.len, pct(cell.p));
        for v in &g.views {
            let Some(c) = v.cells.get(k) else { continue };
            match c.scores.iter().find(|s| s.encoding == enc) {
                Some(s) => {
                    let _ = write!(
                        w,
                        " {} / {} |",
                        pct(s.score_by_file.own_class),
                        pct(s.score.mixed_classes)
                    );
                }
                None => w.push_str(" |"),
            }
            for &i in &graphed {
                let _ = write!(
                    w,
                    " {} |",
                    share(c.own_by_file.get(i).copied().unwrap_or([0, 0]))
                );
            }
        }
        w.push('\n');
    }
    w
}

/// The generated report's section.
pub fn section(g: &GraphEval) -> String {
    let (graph_launches, launches): (usize, usize) = g
        .processes
        .iter()
        .fold((0, 0), |(a, b), c| (a + c.graph_launches, b + c.launches));
    let windows = g.views.first().map_or(0, |v| v.windows_per_source);
    format!(
        "\n## CUDA graph launches (issue 24)\n\n\
         The agent enters a launch of a graph whose construction it saw (stream capture or \
         the explicit graph API) as the graph's kernels in order, and a launch of a graph \
         built before it attached as one `<graph>` element; before issue 24 every graph \
         launch was `<graph>`. The traces mark a kernel a graph launch launched (its \
         correlation id is the launch's, shared by the graph's kernels); {graph_launches} of \
         the {launches} launch calls of all processes are graph launches. Each view below is \
         scored at the shipped configuration (per process, names, n = {DEFAULT_NGRAM_LEN}, \
         weighted 256-bit hash, tau = {DEFAULT_TAU}, the aggregator's rule), with the windows, \
         perturbations and arrival order of the main grid, {windows} windows per process and \
         (L, p), so the expanded view is the main grid's shipped row:\n\n\
         - **expanded**: graph kernels are kernels, as in every table above.\n\
         - **not expanded**: each graph launch (a distinct process and correlation id) is one \
         `<graph>` element at its first kernel's position, its other kernels left out.\n\
         - **mixed**: half of each process's windows expanded and half not, in one \
         population (hosts whose agents saw the graphs built and hosts whose agents attached \
         later): does an application's `<graph>` snippet join its expanded class?\n\n\
         All three views perturb with the same foreign kernels (graphs expanded), so a \
         process without graph launches gets the same windows in every view, and the views \
         differ only through the windows of processes with graph launches.\n\n\
         {}\n\
         Per process: graph launches, and the share of its windows in its own class (per \
         file, all (L, p) cells together). \"names only in graphs\" are kernel names the \
         process launches only inside graphs, which a not-expanded snippet never holds.\n\n\
         {}\n\
         Per (L, p), and the own-class share of each process with graph launches:\n\n{}",
        views_table(g),
        processes_table(g),
        cells_table(g)
    )
}

/// The terminal summary's lines.
pub fn summary(g: &GraphEval) -> String {
    let mut w = String::from("\nCUDA graph launches, per process, shipped configuration:\n");
    for c in g.processes.iter().filter(|c| c.graph_launches > 0) {
        let _ = writeln!(
            w,
            "  {}: {} of {} launches were graph launches ({} of {} kernels, {} distinct graphs)",
            c.file, c.graph_launches, c.launches, c.graph_kernels, c.kernels, c.distinct_graphs
        );
    }
    w.push_str(&views_table(g));
    w
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::corpus::tests::corpus_of;

    /// Kernels a b c d e with b c d one graph launch (correlation 7) and e launched alone.
    fn graphed() -> (Vec<LaunchId>, Vec<Option<i64>>) {
        (
            vec![0, 1, 2, 3, 4],
            vec![None, Some(7), Some(7), Some(7), None],
        )
    }

    #[test]
    fn a_graph_launch_of_three_kernels_is_one_element_unexpanded_and_three_expanded() {
        let corpus = corpus_of(&["a", "b", "c", "d", "e"], &[graphed()]);
        let graph = corpus.launches.len() as LaunchId;
        let not_expanded = view_corpus(&corpus, GraphView::NotExpanded);
        assert_eq!(not_expanded.process[0].seq, [0, graph, 4]);
        let name = not_expanded.launches[graph as usize].0;
        assert_eq!(not_expanded.digests[name as usize], NameDigest::of(GRAPH));
        let expanded = view_corpus(&corpus, GraphView::Expanded);
        assert_eq!(expanded.process[0].seq, [0, 1, 2, 3, 4]);
        let mixed = view_corpus(&corpus, GraphView::Mixed);
        assert_eq!(mixed.process.len(), 2);
        assert_eq!(mixed.process[1].seq, [0, graph, 4]);
        assert_eq!(mixed.process[1].file_label, mixed.process[0].file_label);
    }

    #[test]
    fn each_graph_launch_collapses_once_and_kernels_launched_alone_stay() {
        let (seq, graph) = graphed();
        // Two launches of one graph are two elements, and kernels launched alone never
        // collapse.
        let twice = [Some(7), Some(7), Some(8), Some(8), None];
        assert_eq!(collapse(&seq, &twice, 9), [9, 9, 4]);
        assert_ne!(collapse(&seq, &graph, 9), seq);
        assert_eq!(collapse::<i64>(&seq, &[None; 5], 9), seq);
        // Had the launch's kernels stayed, the counts would say so.
        let corpus = corpus_of(&["a", "b", "c", "d", "e"], &[(seq, graph)]);
        let c = counts(&corpus, &corpus.process[0], &[4, 10], 5);
        assert_eq!(
            (c.kernels, c.graph_kernels, c.launches, c.graph_launches),
            (5, 3, 3, 1)
        );
        assert_eq!((c.distinct_graphs, c.names_only_in_graphs), (1, 3));
        assert!(c.ngram_jaccard < 1.0);
        // Stretches of 10 loop the sequence twice: two graph launches, one per pass.
        assert_eq!(c.stretch_jaccard.len(), 2);
        assert!(c.stretch_jaccard.iter().all(|&(_, j)| j < 1.0));
        let element = corpus.launches.len() as LaunchId;
        let looped = [0, 1, 2, 3, 4, 0, 1, 2, 3, 4];
        let keys: Vec<_> = (0..10)
            .map(|j| graphed().1[j % 5].map(|k| (j / 5, k)))
            .collect();
        assert_eq!(collapse(&looped, &keys, element), [0, 5, 4, 0, 5, 4]);
    }
}
