//! Descriptive statistics and ministat's Student's t comparison of two samples.
//!
//! `ministat` (FreeBSD) is what the seed experiments were judged with, so a
//! figure printed here means what it means there:
//!
//! - [`Summary`] is ministat's row: N, min, max, median (mean of the two middle
//!   values for even N), mean, and the sample standard deviation (N - 1).
//! - [`difference`] is ministat's "Difference at C% confidence": the pooled
//!   standard deviation of both samples, the difference of the means
//!   (second minus first), and its half-width `t * s_pooled * sqrt(1/n1 + 1/n2)`
//!   with `n1 + n2 - 2` degrees of freedom. When the half-width is at least
//!   the absolute difference the verdict is "No difference proven".
//! - ministat takes `t` from a table with a row per degree of freedom up to
//!   100 and an "infinity" row beyond; we compute the same quantiles with an
//!   inverse Student's t (and the normal quantile past 100 degrees of freedom,
//!   as its table does) instead of embedding the table.
//! - ministat's column labelled 99.5% holds the one-sided 0.999 quantile
//!   (318.313 at one degree of freedom, 3.090 at infinity), i.e. a two-sided
//!   99.8% interval. Published ministat output at "99.5%" (the mail-queue seed
//!   quotes several) can only be reproduced with that quantile, so
//!   [`Confidence::P99_5`] uses it too: the interval is slightly wider, never
//!   narrower, than a textbook 99.5% one.
//!
//! Invariants: every function here is pure; inputs with NaN are rejected by
//! the caller (`Summary::of` refuses them), so no NaN reaches a report.

use std::fmt;

/// ministat's row for one sample.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Summary {
    pub n: usize,
    pub min: f64,
    pub max: f64,
    pub median: f64,
    pub mean: f64,
    /// Sample standard deviation (divisor N - 1); 0 when N is 1.
    pub stddev: f64,
}

impl Summary {
    /// The summary of `values`, or `None` when it is empty or holds a NaN.
    #[must_use]
    pub fn of(values: &[f64]) -> Option<Summary> {
        if values.is_empty() || values.iter().any(|v| v.is_nan()) {
            return None;
        }
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        let nf = n as f64;
        let mean = sorted.iter().sum::<f64>() / nf;
        let stddev = if n > 1 {
            (sorted.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / (nf - 1.0)).sqrt()
        } else {
            0.0
        };
        Some(Summary {
            n,
            min: sorted[0],
            max: sorted[n - 1],
            median,
            mean,
            stddev,
        })
    }

    /// A summary from figures already published (N, mean, stddev), for
    /// comparing against ministat output whose raw data is not at hand.
    #[must_use]
    pub fn from_moments(n: usize, mean: f64, stddev: f64) -> Summary {
        Summary {
            n,
            min: f64::NAN,
            max: f64::NAN,
            median: f64::NAN,
            mean,
            stddev,
        }
    }
}

/// The confidence levels ministat offers (`-c`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confidence {
    P80,
    P90,
    P95,
    P98,
    P99,
    /// ministat's default-for-papers level; see the module doc for the
    /// quantile it really uses.
    P99_5,
}

impl Confidence {
    /// Parses "80", "90", "95", "98", "99" or "99.5" (a trailing % is allowed).
    #[must_use]
    pub fn parse(s: &str) -> Option<Confidence> {
        match s.trim().trim_end_matches('%') {
            "80" => Some(Confidence::P80),
            "90" => Some(Confidence::P90),
            "95" => Some(Confidence::P95),
            "98" => Some(Confidence::P98),
            "99" => Some(Confidence::P99),
            "99.5" => Some(Confidence::P99_5),
            _ => None,
        }
    }

    /// The label ministat prints ("99.5").
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Confidence::P80 => "80.0",
            Confidence::P90 => "90.0",
            Confidence::P95 => "95.0",
            Confidence::P98 => "98.0",
            Confidence::P99 => "99.0",
            Confidence::P99_5 => "99.5",
        }
    }

    /// The cumulative probability of the t quantile ministat's table holds
    /// for this level.
    #[must_use]
    pub fn quantile_p(self) -> f64 {
        match self {
            Confidence::P80 => 0.90,
            Confidence::P90 => 0.95,
            Confidence::P95 => 0.975,
            Confidence::P98 => 0.99,
            Confidence::P99 => 0.995,
            Confidence::P99_5 => 0.999,
        }
    }
}

/// Largest degrees of freedom ministat's table has a row for; beyond it the
/// normal quantile ("infinity" row) is used.
pub const MINISTAT_DF_MAX: usize = 100;

/// The t value ministat uses for `df` degrees of freedom at `confidence`.
#[must_use]
pub fn ministat_t(confidence: Confidence, df: usize) -> f64 {
    let p = confidence.quantile_p();
    if df > MINISTAT_DF_MAX {
        normal_quantile(p)
    } else {
        student_t_quantile(p, df as f64)
    }
}

/// ministat's comparison of a second sample against a first.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Difference {
    /// Confidence label, e.g. "99.5".
    #[serde(skip)]
    pub confidence: Confidence,
    /// mean(second) - mean(first).
    pub delta: f64,
    /// Half-width of the interval around `delta`.
    pub half_width: f64,
    /// `delta` as a percentage of mean(first).
    pub delta_pct: f64,
    /// `half_width` as a percentage of mean(first).
    pub half_width_pct: f64,
    pub pooled_stddev: f64,
    pub t: f64,
    /// The interval excludes zero.
    pub proven: bool,
}

impl serde::Serialize for Confidence {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.label())
    }
}

/// ministat's Student's t comparison; `None` unless both samples have at
/// least two values (no variance can be estimated otherwise).
#[must_use]
pub fn difference(first: &Summary, second: &Summary, confidence: Confidence) -> Option<Difference> {
    if first.n < 2 || second.n < 2 {
        return None;
    }
    let (n1, n2) = (first.n as f64, second.n as f64);
    let df = first.n + second.n - 2;
    let pooled_var = ((n1 - 1.0) * first.stddev * first.stddev
        + (n2 - 1.0) * second.stddev * second.stddev)
        / (n1 + n2 - 2.0);
    let pooled_stddev = pooled_var.sqrt();
    let t = ministat_t(confidence, df);
    let half_width = t * pooled_stddev * (1.0 / n1 + 1.0 / n2).sqrt();
    let delta = second.mean - first.mean;
    Some(Difference {
        confidence,
        delta,
        half_width,
        delta_pct: delta * 100.0 / first.mean,
        half_width_pct: half_width * 100.0 / first.mean,
        pooled_stddev,
        t,
        proven: delta.abs() > half_width,
    })
}

impl fmt::Display for Difference {
    /// ministat's wording.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.proven {
            writeln!(f, "Difference at {}% confidence", self.confidence.label())?;
            writeln!(f, "\t{} +/- {}", g6(self.delta), g6(self.half_width))?;
            writeln!(
                f,
                "\t{}% +/- {}%",
                g6(self.delta_pct),
                g6(self.half_width_pct)
            )?;
            write!(f, "\t(Student's t, pooled s = {})", g6(self.pooled_stddev))
        } else {
            write!(
                f,
                "No difference proven at {}% confidence",
                self.confidence.label()
            )
        }
    }
}

/// The `q`-quantile (0..=1) of already sorted values by nearest rank; NaN when
/// empty.
#[must_use]
pub fn percentile_sorted(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// C's `%g`: six significant digits, trailing zeros dropped, exponent form
/// for very large or small magnitudes.
#[must_use]
pub fn g6(x: f64) -> String {
    if x == 0.0 {
        return "0".to_string();
    }
    if !x.is_finite() {
        return format!("{x}");
    }
    // Round to 6 significant digits first so that e.g. 999999.7 moves to
    // the exponent form as C does.
    let s = format!("{x:.5e}");
    let (mantissa, exp) = s.split_once('e').expect("format {:e} has an exponent");
    let exp: i32 = exp.parse().expect("format {:e} exponent is an integer");
    if !(-4..6).contains(&exp) {
        let m = trim_zeros(mantissa);
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{m}e{sign}{:02}", exp.abs());
    }
    let decimals = (5 - exp) as usize;
    trim_zeros(&format!("{x:.decimals$}")).to_string()
}

fn trim_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

// ---------------------------------------------------------------------------
// Distributions. Written for accuracy to ~1e-10 over the ranges used here
// (degrees of freedom 1..1e6, p in 0.5..0.9999).

/// ln Γ(x) for x > 0 (Lanczos, g = 7, nine terms).
fn ln_gamma(x: f64) -> f64 {
    const G: f64 = 7.0;
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection keeps the approximation in its accurate range.
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = C[0];
    let t = x + G + 0.5;
    for (i, c) in C.iter().enumerate().skip(1) {
        let i = i as f64;
        a += c / (x + i);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// Continued fraction for the regularized incomplete beta (modified Lentz).
fn beta_continued_fraction(a: f64, b: f64, x: f64) -> f64 {
    const TINY: f64 = 1e-300;
    const EPS: f64 = 1e-15;
    let (qab, qap, qam) = (a + b, a + 1.0, a - 1.0);
    let mut c = 1.0;
    let mut d = 1.0 - qab * x / qap;
    if d.abs() < TINY {
        d = TINY;
    }
    d = 1.0 / d;
    let mut h = d;
    // One Lentz step with coefficient `aa`: returns the factor h moves by.
    let mut step = |aa: f64| {
        d = 1.0 + aa * d;
        if d.abs() < TINY {
            d = TINY;
        }
        c = 1.0 + aa / c;
        if c.abs() < TINY {
            c = TINY;
        }
        d = 1.0 / d;
        d * c
    };
    for m in 1..10_000 {
        let m = f64::from(m);
        let m2 = 2.0 * m;
        h *= step(m * (b - m) * x / ((qam + m2) * (a + m2))); // even step
        let delta = step(-(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))); // odd step
        h *= delta;
        if (delta - 1.0).abs() < EPS {
            break;
        }
    }
    h
}

/// Regularized incomplete beta I_x(a, b).
fn incomplete_beta(a: f64, b: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let ln_front = ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln();
    let front = ln_front.exp();
    // The continued fraction converges fast only below the mean; use the
    // symmetry I_x(a,b) = 1 - I_{1-x}(b,a) above it.
    if x < (a + 1.0) / (a + b + 2.0) {
        front * beta_continued_fraction(a, b, x) / a
    } else {
        1.0 - front * beta_continued_fraction(b, a, 1.0 - x) / b
    }
}

/// P(T <= t) for Student's t with `df` degrees of freedom.
#[must_use]
pub fn student_t_cdf(t: f64, df: f64) -> f64 {
    let tail = 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t));
    if t >= 0.0 {
        1.0 - tail
    } else {
        tail
    }
}

/// Regularized lower incomplete gamma P(a, x) by its series (fine for the
/// small x used by the normal quantile).
fn lower_gamma_regularized(a: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    let mut term = 1.0 / a;
    let mut sum = term;
    let mut n = a;
    for _ in 0..100_000 {
        n += 1.0;
        term *= x / n;
        sum += term;
        if term < sum * 1e-17 {
            break;
        }
    }
    sum * (-x + a * x.ln() - ln_gamma(a)).exp()
}

/// Φ(z), the standard normal CDF, for |z| up to about 8.
#[must_use]
pub fn normal_cdf(z: f64) -> f64 {
    let half = 0.5 * lower_gamma_regularized(0.5, z * z / 2.0);
    if z >= 0.0 {
        0.5 + half
    } else {
        0.5 - half
    }
}

/// Inverts a CDF that increases on [0, ∞) for p in (0.5, 1) by bisection.
fn invert_upper(p: f64, cdf: impl Fn(f64) -> f64) -> f64 {
    assert!(p > 0.5 && p < 1.0, "quantile p={p} outside (0.5, 1)");
    let mut lo = 0.0;
    let mut hi = 1.0;
    while cdf(hi) < p {
        hi *= 2.0;
        assert!(hi < 1e12, "quantile search diverged for p={p}");
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if cdf(mid) < p {
            lo = mid;
        } else {
            hi = mid;
        }
        if hi - lo <= 1e-13 * hi {
            break;
        }
    }
    0.5 * (lo + hi)
}

/// The p-quantile (p in (0.5, 1)) of Student's t with `df` degrees of freedom.
#[must_use]
pub fn student_t_quantile(p: f64, df: f64) -> f64 {
    invert_upper(p, |t| student_t_cdf(t, df))
}

/// The p-quantile (p in (0.5, 1)) of the standard normal distribution.
#[must_use]
pub fn normal_quantile(p: f64) -> f64 {
    invert_upper(p, normal_cdf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * b.abs().max(1e-12)
    }

    /// ministat(1)'s manual page example: iguana vs chameleon at 95%.
    #[test]
    fn ministat_manual_example_matches() {
        let iguana = [50.0, 200.0, 150.0, 400.0, 750.0, 400.0, 150.0];
        let chameleon = [150.0, 400.0, 720.0, 500.0, 930.0];
        let x = Summary::of(&iguana).unwrap();
        let y = Summary::of(&chameleon).unwrap();
        assert_eq!(
            (x.n, x.min, x.max, x.median, x.mean),
            (7, 50.0, 750.0, 200.0, 300.0)
        );
        assert_eq!(g6(x.stddev), "238.048");
        assert!(close(x.stddev, 238.047_61, 1e-7));
        assert_eq!(
            (y.n, y.min, y.max, y.median, y.mean),
            (5, 150.0, 930.0, 500.0, 540.0)
        );
        assert!(close(y.stddev, 299.081_93, 1e-7));
        let d = difference(&x, &y, Confidence::P95).unwrap();
        assert!(!d.proven);
        assert_eq!(d.to_string(), "No difference proven at 95.0% confidence");
        // With 10 degrees of freedom ministat's table holds 2.228 at 95%.
        assert!(close(d.t, 2.228, 1e-3));
    }

    /// The mail-queue seed (001) quotes ministat at 99.5% with N = 60/61:
    /// every published interval must come out of the published moments.
    #[test]
    fn mail_queue_seed_differences_match_published_ministat_output() {
        let cases = [
            // (first n, mean, sd), (second n, mean, sd), delta, ±, pct, ±pct
            (
                (61, 1143.7705, 88.056_496),
                (60, 56522.367, 4354.2006),
                Some((55378.6, 1722.91, 4841.76, 150.634)),
            ),
            (
                (60, 56522.367, 4354.2006),
                (60, 11781.067, 1156.3799),
                Some((-44741.3, 1797.18, -79.1568, 3.179_59)),
            ),
            (
                (60, 11781.067, 1156.3799),
                (60, 9841.6, 1070.5916),
                Some((-1939.47, 628.644, -16.4626, 5.336_05)),
            ),
            ((60, 9841.6, 1070.5916), (60, 9691.6833, 1099.0576), None),
            ((60, 11781.067, 1156.3799), (60, 11771.4, 1068.0186), None),
        ];
        for (a, b, want) in cases {
            let x = Summary::from_moments(a.0, a.1, a.2);
            let y = Summary::from_moments(b.0, b.1, b.2);
            let d = difference(&x, &y, Confidence::P99_5).unwrap();
            match want {
                Some((delta, hw, pct, hwpct)) => {
                    assert!(d.proven, "{a:?} vs {b:?}");
                    assert!(close(d.delta, delta, 2e-6), "{} vs {delta}", d.delta);
                    // Published figures come from a 3-decimal t table.
                    assert!(close(d.half_width, hw, 2e-4), "{} vs {hw}", d.half_width);
                    assert!(close(d.delta_pct, pct, 2e-6), "{} vs {pct}", d.delta_pct);
                    assert!(close(d.half_width_pct, hwpct, 2e-4));
                }
                None => {
                    assert!(!d.proven, "{a:?} vs {b:?}: {d}");
                }
            }
        }
    }

    #[test]
    fn difference_text_is_ministats() {
        let x = Summary::from_moments(60, 11781.067, 1156.3799);
        let y = Summary::from_moments(60, 9841.6, 1070.5916);
        let d = difference(&x, &y, Confidence::P99_5).unwrap();
        let text = d.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "Difference at 99.5% confidence");
        assert!(lines[1].starts_with("\t-1939.47 +/- 628.6"), "{text}");
        assert!(lines[2].starts_with("\t-16.4626% +/- 5.33"), "{text}");
        assert!(
            lines[3].starts_with("\t(Student's t, pooled s = 1114."),
            "{text}"
        );
    }

    /// Reference quantiles (standard tables, 6+ digits).
    #[test]
    fn t_and_normal_quantiles_match_reference_values() {
        let cases = [
            (0.975, 1.0, 12.706_204_736),
            (0.975, 10.0, 2.228_138_852),
            (0.995, 5.0, 4.032_142_984),
            (0.999, 1.0, 318.308_838_986),
            (0.999, 4.0, 7.173_182_220),
            (0.999, 30.0, 3.385_184_867),
            (0.9975, 10.0, 3.581_406_202),
            (0.95, 100.0, 1.660_234_326),
        ];
        for (p, df, want) in cases {
            let got = student_t_quantile(p, df);
            assert!(close(got, want, 1e-8), "t({p}, {df}) = {got}, want {want}");
        }
        assert!(close(normal_quantile(0.975), 1.959_963_985, 1e-9));
        assert!(close(normal_quantile(0.999), 3.090_232_306, 1e-9));
        assert!(close(normal_quantile(0.9975), 2.807_033_768, 1e-9));
    }

    /// ministat's table: 99.5% column at df 1 and infinity, 95% at df 10.
    #[test]
    fn ministat_t_follows_its_table_columns() {
        assert!(close(ministat_t(Confidence::P99_5, 1), 318.313, 2e-5));
        assert!(close(ministat_t(Confidence::P99_5, 101), 3.090, 1e-4));
        assert!(close(ministat_t(Confidence::P95, 10), 2.228, 1e-4));
        assert!(close(ministat_t(Confidence::P80, 1000), 1.282, 1e-3));
    }

    #[test]
    fn summary_of_odd_even_and_single_samples() {
        let s = Summary::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.mean, s.stddev), (2.0, 2.0, 1.0));
        let s = Summary::of(&[4.0, 1.0, 2.0, 3.0]).unwrap();
        assert_eq!(s.median, 2.5);
        let s = Summary::of(&[7.0]).unwrap();
        assert_eq!((s.n, s.stddev), (1, 0.0));
        assert!(difference(&s, &s, Confidence::P95).is_none());
        assert!(Summary::of(&[]).is_none());
        assert!(Summary::of(&[1.0, f64::NAN]).is_none());
    }

    #[test]
    fn identical_samples_show_no_difference() {
        let s = Summary::of(&[10.0, 11.0, 12.0]).unwrap();
        let d = difference(&s, &s, Confidence::P99_5).unwrap();
        assert!(!d.proven);
        assert_eq!(d.delta, 0.0);
    }

    #[test]
    fn percentile_is_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile_sorted(&v, 0.5), 50.0);
        assert_eq!(percentile_sorted(&v, 0.99), 99.0);
        assert_eq!(percentile_sorted(&v, 1.0), 100.0);
        assert_eq!(percentile_sorted(&v, 0.0), 1.0);
        assert!(percentile_sorted(&[], 0.5).is_nan());
    }

    #[test]
    fn g6_formats_like_c() {
        assert_eq!(g6(55378.5965), "55378.6");
        assert_eq!(g6(1722.9123), "1722.91");
        assert_eq!(g6(-16.462_575), "-16.4626");
        assert_eq!(g6(1_234_567.0), "1.23457e+06");
        assert_eq!(g6(0.000_012_345), "1.2345e-05");
        assert_eq!(g6(2.0), "2");
        assert_eq!(g6(0.5), "0.5");
    }
}
