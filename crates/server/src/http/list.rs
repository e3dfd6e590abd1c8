//! RabbitMQ's list query parameters, shared by every list endpoint:
//! `page`, `page_size`, `name`, `use_regex`, `pagination`, `sort`,
//! `sort_reverse`, `columns`, `disable_stats`, `enable_queue_totals`.
//!
//! Invariants:
//! - Without `page` a list is a plain JSON array; with it, RabbitMQ's page
//!   object (`items`, `page`, `page_count`, `page_size`, `filtered_count`,
//!   `item_count`, `total_count`).
//! - `page_size` is at most [`PAGE_SIZE_MAX`], as in RabbitMQ.

use std::cmp::Ordering;
use std::collections::HashMap;

use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};

use super::{bad_request, error_400};

/// RabbitMQ's default `page_size`.
pub const PAGE_SIZE_DEFAULT: usize = 100;
/// RabbitMQ's largest `page_size`.
pub const PAGE_SIZE_MAX: usize = 500;
/// The longest `name` regex accepted, in bytes (a compiled regex costs
/// memory in proportion).
pub const NAME_REGEX_BYTES_MAX: usize = 1024;

/// The parsed list parameters.
pub struct ListParams {
    page: Option<usize>,
    page_size: usize,
    name: Option<NameFilter>,
    sort: Option<String>,
    sort_reverse: bool,
    columns: Option<Vec<String>>,
    /// `disable_stats=true`: leave out rates and counters.
    pub disable_stats: bool,
    /// With `disable_stats`, keep the message counts.
    pub enable_queue_totals: bool,
}

enum NameFilter {
    Substring(String),
    Regex(regex::Regex),
}

impl NameFilter {
    fn matches(&self, name: &str) -> bool {
        match self {
            Self::Substring(s) => name.to_lowercase().contains(s),
            Self::Regex(r) => r.is_match(name),
        }
    }
}

fn number(q: &HashMap<String, String>, key: &str) -> Result<Option<usize>, Response> {
    match q.get(key) {
        None => Ok(None),
        Some(v) => match v.parse::<usize>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(bad_request(format!(
                "{key} must be a positive integer, got '{v}'"
            ))),
        },
    }
}

impl ListParams {
    pub fn parse(q: &HashMap<String, String>) -> Result<Self, Response> {
        let page = number(q, "page")?;
        let page_size = number(q, "page_size")?.unwrap_or(PAGE_SIZE_DEFAULT);
        if page_size > PAGE_SIZE_MAX {
            return Err(error_400(
                "invalid_pagination_parameters",
                format!(
                    "Invalid pagination parameters: page number {}, page size {page_size} (at most {PAGE_SIZE_MAX})",
                    page.unwrap_or(1)
                ),
            ));
        }
        let name = match q.get("name").filter(|n| !n.is_empty()) {
            None => None,
            Some(n) if super::query_flag(q, "use_regex") => {
                if n.len() > NAME_REGEX_BYTES_MAX {
                    return Err(bad_request(format!(
                        "name regex longer than {NAME_REGEX_BYTES_MAX} bytes"
                    )));
                }
                let r = regex::RegexBuilder::new(n)
                    .case_insensitive(true)
                    .build()
                    .map_err(|e| bad_request(format!("invalid name regex: {e}")))?;
                Some(NameFilter::Regex(r))
            }
            Some(n) => Some(NameFilter::Substring(n.to_lowercase())),
        };
        Ok(Self {
            page,
            page_size,
            name,
            sort: q.get("sort").filter(|s| !s.is_empty()).cloned(),
            sort_reverse: super::query_flag(q, "sort_reverse"),
            columns: q
                .get("columns")
                .map(|c| c.split(',').map(str::to_owned).collect()),
            disable_stats: super::query_flag(q, "disable_stats"),
            enable_queue_totals: super::query_flag(q, "enable_queue_totals"),
        })
    }

    /// Whether an item named `name` passes the `name` filter.
    pub fn keeps(&self, name: &str) -> bool {
        self.name.as_ref().is_none_or(|f| f.matches(name))
    }

    /// Whether items must all be built before paging (a sort on a field
    /// other than the natural vhost/name order).
    pub fn needs_all(&self) -> bool {
        self.sort.as_deref().is_some_and(|s| s != "name")
    }

    /// Sorts, pages and projects `items` (already filtered by name and in
    /// natural order); `total` is the count before filtering.
    pub fn respond(&self, mut items: Vec<Value>, total: usize) -> Response {
        if let Some(key) = &self.sort {
            items.sort_by(|a, b| compare(lookup(a, key), lookup(b, key)));
        }
        if self.sort_reverse {
            items.reverse();
        }
        let filtered = items.len();
        let Some(page) = self.page else {
            return Json(self.project(items)).into_response();
        };
        self.page_object(page, filtered, total, |start, take| {
            items.into_iter().skip(start).take(take).collect()
        })
    }

    /// The page asked for, as (items to skip, items to take), when it
    /// lists items in their natural order with no name filter: then the
    /// caller can fetch the page alone, and answer with
    /// [`ListParams::respond_page`].
    pub fn natural_page(&self) -> Option<(usize, usize)> {
        if self.needs_all() || self.sort_reverse || self.name.is_some() {
            return None;
        }
        let page = self.page?;
        Some(((page - 1).saturating_mul(self.page_size), self.page_size))
    }

    /// The page object for the page [`ListParams::natural_page`] named,
    /// out of `total` items (none filtered out).
    pub fn respond_page(&self, page_items: Vec<Value>, total: usize) -> Response {
        self.page_object(self.page.unwrap_or(1), total, total, |_, _| page_items)
    }

    /// Pages without sorting: for the natural order, only the page's
    /// items need building. `names` are the filtered items' names in
    /// order; `build` makes one item's JSON.
    pub fn respond_lazy<T>(
        &self,
        items: Vec<T>,
        total: usize,
        build: impl Fn(&T) -> Value,
    ) -> Response {
        if self.needs_all() || self.page.is_none() || self.sort_reverse {
            return self.respond(items.iter().map(&build).collect(), total);
        }
        self.page_object(self.page.unwrap_or(1), items.len(), total, |start, take| {
            items.iter().skip(start).take(take).map(build).collect()
        })
    }

    /// The page object of page `page` out of `filtered` items (`total`
    /// before filtering); `page_items(start, take)` makes the page's items
    /// once the page is known to exist.
    fn page_object(
        &self,
        page: usize,
        filtered: usize,
        total: usize,
        page_items: impl FnOnce(usize, usize) -> Vec<Value>,
    ) -> Response {
        let page_count = filtered.div_ceil(self.page_size);
        if page > page_count.max(1) {
            return self.out_of_range(page, filtered);
        }
        let page_items = page_items((page - 1) * self.page_size, self.page_size);
        Json(json!({
            "filtered_count": filtered,
            "item_count": page_items.len(),
            "items": self.project(page_items),
            "page": page,
            "page_count": page_count,
            "page_size": self.page_size,
            "total_count": total,
        }))
        .into_response()
    }

    fn out_of_range(&self, page: usize, len: usize) -> Response {
        error_400(
            "page_out_of_range",
            format!(
                "Page out of range, page: {page} page size: {}, len: {len}",
                self.page_size
            ),
        )
    }

    fn project(&self, items: Vec<Value>) -> Vec<Value> {
        let Some(cols) = &self.columns else {
            return items;
        };
        items
            .into_iter()
            .map(|item| {
                let mut out = Value::Object(Map::new());
                for c in cols {
                    if let Some(v) = lookup(&item, c) {
                        insert_path(&mut out, c, v.clone());
                    }
                }
                out
            })
            .collect()
    }
}

/// A dotted path (`message_stats.publish_details.rate`) into `v`.
fn lookup<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(v, |v, k| v.get(k))
}

fn insert_path(out: &mut Value, path: &str, v: Value) {
    let mut cur = out;
    let mut parts = path.split('.').peekable();
    while let Some(k) = parts.next() {
        let Value::Object(m) = cur else { return };
        if parts.peek().is_none() {
            m.insert(k.to_owned(), v);
            return;
        }
        cur = m
            .entry(k.to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
    }
}

/// Missing values first, then numbers, then strings, as RabbitMQ orders
/// mixed columns.
fn compare(a: Option<&Value>, b: Option<&Value>) -> Ordering {
    match (a, b) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (Some(Value::Number(x)), Some(Value::Number(y))) => x
            .as_f64()
            .unwrap_or(0.0)
            .total_cmp(&y.as_f64().unwrap_or(0.0)),
        (Some(Value::String(x)), Some(Value::String(y))) => x.cmp(y),
        (Some(Value::Bool(x)), Some(Value::Bool(y))) => x.cmp(y),
        (Some(x), Some(y)) => x.to_string().cmp(&y.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> ListParams {
        let q: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        ListParams::parse(&q).unwrap_or_else(|_| panic!("params {pairs:?} parse"))
    }

    #[test]
    fn regex_name_filter_is_case_insensitive_and_substring_filter_too() {
        let p = params(&[("name", "^ORD.*s$"), ("use_regex", "true")]);
        assert!(p.keeps("orders"));
        assert!(!p.keeps("my-orders"));
        let p = params(&[("name", "Der")]);
        assert!(p.keeps("orders"));
        assert!(!p.keeps("jobs"));
    }

    #[test]
    fn dotted_columns_keep_their_nesting() {
        let p = params(&[("columns", "name,message_stats.publish_details.rate")]);
        let item = json!({"name": "q", "x": 1, "message_stats": {"publish_details": {"rate": 2.5}, "ack": 3}});
        assert_eq!(
            p.project(vec![item]),
            vec![json!({"name": "q", "message_stats": {"publish_details": {"rate": 2.5}}})]
        );
    }

    #[test]
    fn numbers_sort_numerically_and_missing_values_first() {
        let mut v = [json!({"m": 10}), json!({}), json!({"m": 9})];
        v.sort_by(|a, b| compare(lookup(a, "m"), lookup(b, "m")));
        assert_eq!(v, [json!({}), json!({"m": 9}), json!({"m": 10})]);
    }

    #[test]
    fn oversized_pages_and_bad_numbers_are_refused() {
        for bad in [("page_size", "501"), ("page", "0"), ("page", "x")] {
            let q: HashMap<String, String> =
                [(bad.0.to_owned(), bad.1.to_owned())].into_iter().collect();
            assert!(ListParams::parse(&q).is_err(), "{bad:?}");
        }
    }
}
