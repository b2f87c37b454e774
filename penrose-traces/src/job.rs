//! Which trace files belong to one job: ranks of one distributed job are one application.

use std::path::Path;

/// The job a trace file belongs to: its file name without `.json`/`.json.gz` and with the number
/// after `rank` (and an optional `-` or `_`) removed, so that `x_rank-0.json.gz` and
/// `x_rank-1.json.gz` are one job. Evaluations use it as ground truth ("one job, one
/// application").
pub fn job_name(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = name.trim_end_matches(".gz").trim_end_matches(".json");
    let lower = stem.to_ascii_lowercase();
    let bytes = lower.as_bytes();
    let mut out = String::with_capacity(stem.len());
    let mut copied = 0;
    let mut search = 0;
    while let Some(found) = lower[search..].find("rank") {
        let mut i = search + found + "rank".len();
        if i < bytes.len() && (bytes[i] == b'-' || bytes[i] == b'_') {
            i += 1;
        }
        let digits = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        if i > digits {
            // Keep everything up to and including "rank", drop the separator and digits.
            out.push_str(&stem[copied..search + found + "rank".len()]);
            copied = i;
        }
        search = i.max(search + found + 1);
    }
    out.push_str(&stem[copied..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_of_one_job_share_a_name() {
        let a = job_name(Path::new("/t/hta-trace_filter--sampled_rank-0.json.gz"));
        let b = job_name(Path::new("hta-trace_filter--sampled_rank-1.json.gz"));
        assert_eq!(a, b);
        assert_eq!(a, "hta-trace_filter--sampled_rank");
        assert_eq!(
            job_name(Path::new("rank0.json")),
            job_name(Path::new("rank12.json"))
        );
        assert_ne!(
            job_name(Path::new("hta-trace_diff--control--control.json.gz")),
            job_name(Path::new("hta-nccl_parser_config--nccl_data.json.gz"))
        );
        // "rank" without a number is part of the name.
        assert_eq!(job_name(Path::new("ranking.json")), "ranking");
    }
}
