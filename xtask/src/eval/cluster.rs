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

/// The online rule (DESIGN.md section 6): windows arrive in `order`; each joins the class whose
/// representatives it matches best, if that estimate is >= tau, else founds a class. A class's
/// representatives are its first `reps` members. Returns each window's class; classes are
/// numbered in founding order.
pub fn online(order: &[usize], sim: &SimMatrix, tau: f64, reps: usize) -> Vec<usize> {
    let mut class_of = vec![usize::MAX; sim.n];
    let mut representatives: Vec<Vec<usize>> = Vec::new();
    for &w in order {
        let best = representatives
            .iter()
            .enumerate()
            .map(|(c, members)| {
                let s = members
                    .iter()
                    .map(|&r| sim.get(w, r))
                    .fold(f32::MIN, f32::max);
                (c, s)
            })
            .max_by(|a, b| a.1.total_cmp(&b.1));
        match best {
            Some((c, s)) if f64::from(s) >= tau => {
                class_of[w] = c;
                if representatives[c].len() < reps {
                    representatives[c].push(w);
                }
            }
            _ => {
                class_of[w] = representatives.len();
                representatives.push(vec![w]);
            }
        }
    }
    class_of
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
    let n_labels = labels.iter().max().map_or(0, |m| m + 1);
    let n_apps = apps.iter().max().map_or(0, |m| m + 1);
    let mut by_class = vec![vec![0usize; n_labels]; classes];
    let mut apps_in = vec![vec![false; n_apps]; classes];
    for ((&c, &l), &a) in class_of.iter().zip(labels).zip(apps) {
        by_class[c][l] += 1;
        apps_in[c][a] = true;
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
    let correct = class_of
        .iter()
        .zip(labels)
        .filter(|&(&c, &l)| majority[c] == Some(l) && home[l] == Some(c))
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
    }

    #[test]
    fn online_rule_joins_best_match_above_tau() {
        // Windows 0,1 similar; 2 unrelated.
        let sim = SimMatrix::new(3, |i, j| if i + j == 1 { 0.9 } else { 0.1 });
        assert_eq!(online(&[0, 1, 2], &sim, 0.85, 1), vec![0, 0, 1]);
        assert_eq!(online(&[0, 1, 2], &sim, 0.95, 1), vec![0, 1, 2]);
    }
}
