//! The aggregator's online clustering, simulated, and how its classes are scored.

/// Pairwise similarities of the windows of one cell.
pub struct SimMatrix {
    n: usize,
    values: Vec<f32>,
}

impl SimMatrix {
    /// Fills the matrix with `sim(i, j)` for i < j.
    pub fn new(n: usize, sim: impl Fn(usize, usize) -> f64) -> Self {
        let mut values = vec![1.0; n * n];
        for i in 0..n {
            for j in i + 1..n {
                let s = sim(i, j) as f32;
                values[i * n + j] = s;
                values[j * n + i] = s;
            }
        }
        Self { n, values }
    }

    fn get(&self, i: usize, j: usize) -> f32 {
        self.values[i * self.n + j]
    }
}

/// How the simulated aggregator keeps and heals its classes (the server's rule is in
/// `penrose_aggregator::tables`; the defaults below are its constants).
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Rule {
    /// Most representatives a class holds (a merge keeps the survivor's first, then the
    /// others' while there is room).
    pub max_reps: usize,
    /// A joining window becomes a representative while its best similarity to the class is
    /// below `tau + novelty * (1 - tau)` (1.0: every joining window, while there is room).
    pub novelty: f64,
    /// A window that matches two or more classes at >= tau joins them into one.
    pub merge: bool,
}

/// The online rule (docs/design.md section 6): windows arrive in `order`; each joins the class whose
/// representatives it matches best, if that estimate is >= tau, else founds a class. With
/// `rule.merge`, every other class it also matches at >= tau is merged into the oldest of them,
/// representatives and members alike. Returns each window's final class, numbered by the
/// founding order of the classes that survive.
pub fn online(order: &[usize], sim: &SimMatrix, tau: f64, rule: Rule) -> Vec<usize> {
    let mut class_of = vec![usize::MAX; sim.n];
    // Per founded class: its representatives (empty once merged away) and where it went.
    let mut representatives: Vec<Vec<usize>> = Vec::new();
    let mut parent: Vec<usize> = Vec::new();
    let root = |parent: &[usize], mut c: usize| {
        while parent[c] != c {
            c = parent[c];
        }
        c
    };
    for &w in order {
        let matches: Vec<(usize, f32)> = (0..representatives.len())
            .filter(|&c| parent[c] == c)
            .map(|c| {
                let s = representatives[c]
                    .iter()
                    .map(|&r| sim.get(w, r))
                    .fold(f32::MIN, f32::max);
                (c, s)
            })
            .filter(|&(_, s)| f64::from(s) >= tau)
            .collect();
        let Some(&(best, best_sim)) = matches
            .iter()
            .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)))
        else {
            class_of[w] = representatives.len();
            parent.push(representatives.len());
            representatives.push(vec![w]);
            continue;
        };
        let mut home = best;
        if rule.merge && matches.len() > 1 {
            home = matches.iter().map(|m| m.0).min().unwrap_or(best);
            for &(c, _) in &matches {
                if c != home {
                    parent[c] = home;
                    let moved = std::mem::take(&mut representatives[c]);
                    let room = rule.max_reps.saturating_sub(representatives[home].len());
                    representatives[home].extend(moved.into_iter().take(room));
                }
            }
        }
        class_of[w] = home;
        let novel = f64::from(best_sim) < tau + rule.novelty * (1.0 - tau);
        if novel && representatives[home].len() < rule.max_reps {
            representatives[home].push(w);
        }
    }
    // Final classes: roots, renumbered densely in founding order.
    let mut number = vec![usize::MAX; parent.len()];
    let mut next = 0;
    for c in 0..parent.len() {
        if parent[c] == c {
            number[c] = next;
            next += 1;
        }
    }
    class_of.iter().map(|&c| number[root(&parent, c)]).collect()
}

/// How well classes match the ground truth.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Score {
    /// Share of windows in their own application's class (see [`score`]).
    pub own_class: f64,
    /// Share of classes whose windows come from two or more applications.
    pub mixed_classes: f64,
    /// Number of classes formed.
    pub classes: usize,
}

/// A window is in its own application's class when (1) the largest share of its class's
/// windows carries its label (a strict majority label, ties count as no majority), and (2) that
/// class holds more of the label's windows than any other class (ties go to the class founded
/// first). (2) stops a split of one application into many classes from counting as correct;
/// (1) stops a merge of several applications from counting for all of them.
pub fn score(class_of: &[usize], labels: &[usize], apps: &[usize]) -> Score {
    let classes = class_of.iter().max().map_or(0, |m| m + 1);
    let n_apps = apps.iter().max().map_or(0, |m| m + 1);
    let mut apps_in = vec![vec![false; n_apps]; classes];
    for (&c, &a) in class_of.iter().zip(apps) {
        apps_in[c][a] = true;
    }
    let correct = in_own_class(class_of, labels)
        .into_iter()
        .filter(|&x| x)
        .count();
    let mixed = apps_in
        .iter()
        .filter(|a| a.iter().filter(|&&x| x).count() > 1)
        .count();
    Score {
        own_class: correct as f64 / class_of.len().max(1) as f64,
        mixed_classes: mixed as f64 / classes.max(1) as f64,
        classes,
    }
}

/// Per label (indexed by label): how many of its windows are in their own class (as
/// [`score`] counts them) and how many windows it has.
pub fn own_class_by_label(class_of: &[usize], labels: &[usize]) -> Vec<[usize; 2]> {
    let n_labels = labels.iter().max().map_or(0, |m| m + 1);
    let mut out = vec![[0, 0]; n_labels];
    for (&l, ok) in labels.iter().zip(in_own_class(class_of, labels)) {
        out[l][0] += usize::from(ok);
        out[l][1] += 1;
    }
    out
}

/// Whether each window is in its own label's class (see [`score`]).
fn in_own_class(class_of: &[usize], labels: &[usize]) -> Vec<bool> {
    let classes = class_of.iter().max().map_or(0, |m| m + 1);
    let n_labels = labels.iter().max().map_or(0, |m| m + 1);
    let mut by_class = vec![vec![0usize; n_labels]; classes];
    for (&c, &l) in class_of.iter().zip(labels) {
        by_class[c][l] += 1;
    }
    let majority: Vec<Option<usize>> = by_class
        .iter()
        .map(|counts| {
            let max = counts.iter().copied().max().unwrap_or(0);
            let mut top = counts.iter().enumerate().filter(|(_, n)| **n == max);
            match (top.next(), top.next()) {
                (Some((l, _)), None) if max > 0 => Some(l),
                _ => None,
            }
        })
        .collect();
    let home: Vec<Option<usize>> = (0..n_labels)
        .map(|l| {
            (0..classes)
                .filter(|&c| by_class[c][l] > 0)
                .max_by(|&a, &b| by_class[a][l].cmp(&by_class[b][l]).then(b.cmp(&a)))
        })
        .collect();
    class_of
        .iter()
        .zip(labels)
        .map(|(&c, &l)| majority[c] == Some(l) && home[l] == Some(c))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perfect_split_merge_and_fragmentation() {
        let labels = [0, 0, 0, 1, 1, 1];
        assert_eq!(score(&[0, 0, 0, 1, 1, 1], &labels, &labels).own_class, 1.0);
        // Everything merged: label 0 has no strict majority.
        let merged = score(&[0; 6], &labels, &labels);
        assert_eq!(merged.own_class, 0.0);
        assert_eq!(merged.mixed_classes, 1.0);
        // Every window alone: only one window per label sits in its label's home class.
        let alone = score(&[0, 1, 2, 3, 4, 5], &labels, &labels);
        assert!((alone.own_class - 2.0 / 6.0).abs() < 1e-12);
        assert_eq!(alone.mixed_classes, 0.0);
        // Per label: the home class's window only.
        assert_eq!(
            own_class_by_label(&[0, 1, 2, 3, 4, 5], &labels),
            [[1, 3], [1, 3]]
        );
        assert_eq!(
            own_class_by_label(&[0, 0, 1, 1, 1, 1], &labels),
            [[2, 3], [3, 3]]
        );
    }

    #[test]
    fn online_rule_joins_best_match_above_tau() {
        // Windows 0,1 similar; 2 unrelated.
        let sim = SimMatrix::new(3, |i, j| if i + j == 1 { 0.9 } else { 0.1 });
        let rule = Rule {
            max_reps: 1,
            novelty: 0.5,
            merge: false,
        };
        assert_eq!(online(&[0, 1, 2], &sim, 0.85, rule), vec![0, 0, 1]);
        assert_eq!(online(&[0, 1, 2], &sim, 0.95, rule), vec![0, 1, 2]);
    }

    #[test]
    fn a_window_matching_two_classes_joins_them() {
        // 0 and 2 are unrelated; 1 matches both.
        let sim = SimMatrix::new(3, |i, j| if i.abs_diff(j) == 1 { 0.6 } else { 0.1 });
        let rule = Rule {
            max_reps: 8,
            novelty: 0.5,
            merge: true,
        };
        assert_eq!(online(&[0, 2, 1], &sim, 0.5, rule), vec![0, 0, 0]);
        let apart = Rule {
            merge: false,
            ..rule
        };
        assert_eq!(online(&[0, 2, 1], &sim, 0.5, apart), vec![0, 0, 1]);
    }
}
