//! A window of a paged list: CSI pages with opaque tokens of any size, the
//! provider with numbered pages; a window is read in the provider's
//! largest pages.

use csi_controller::{BackendResult, ProviderPage};
use csi_driver::CsiError;

use crate::api::{MAX_PER_PAGE, Page, PageRequest};

use super::ProviderError;

/// Items `offset..offset + want` of the list `fetch` pages through (fewer
/// at its end), and the offset after them while the list goes on.
pub async fn read_window<T, Fut>(
    offset: usize,
    want: usize,
    fetch: impl Fn(PageRequest) -> Fut,
) -> Result<(Vec<T>, Option<usize>), ProviderError>
where
    Fut: Future<Output = Result<Page<T>, ProviderError>>,
{
    let per = MAX_PER_PAGE as usize;
    let (mut page, mut skip) = ((offset / per + 1) as u32, offset % per);
    let mut items = Vec::new();
    loop {
        let per_page = MAX_PER_PAGE;
        let got = fetch(PageRequest { page, per_page }).await?;
        items.extend(got.items.into_iter().skip(skip));
        skip = 0;
        if items.len() >= want || got.next_page.is_none() {
            items.truncate(want);
            let end = offset + items.len();
            return Ok((items, ((end as u64) < got.total).then_some(end)));
        }
        page += 1;
    }
}

/// A CSI page of the list `fetch` pages through: CSI's token is an
/// offset (a bad one is ABORTED, as the spec says), `max_entries` 0 is all.
pub async fn page<T, U, Fut>(
    token: &str,
    max_entries: i32,
    fetch: impl Fn(PageRequest) -> Fut,
    view: impl Fn(T) -> U,
) -> BackendResult<ProviderPage<U>>
where
    Fut: Future<Output = Result<Page<T>, ProviderError>>,
{
    let offset = match token {
        "" => 0,
        t => t.parse().map_err(|_| {
            CsiError::Aborted(format!("starting_token {t:?} is not one this plugin gave"))
        })?,
    };
    let want = usize::try_from(max_entries).ok().filter(|&n| n > 0);
    let (items, next) = read_window(offset, want.unwrap_or(usize::MAX), fetch).await?;
    let entries = items.into_iter().map(view).collect();
    let next_token = next.map_or_else(String::new, |n| n.to_string());
    Ok(ProviderPage {
        entries,
        next_token,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A list of `n` numbers in the provider's pages.
    async fn list(n: usize, req: PageRequest) -> Result<Page<usize>, ProviderError> {
        let per = req.per_page as usize;
        let start = (req.page as usize - 1) * per;
        let items: Vec<usize> = (start..n.min(start + per)).collect();
        let next_page = (start + per < n).then_some(req.page + 1);
        Ok(Page {
            items,
            next_page,
            total: n as u64,
        })
    }

    #[tokio::test]
    async fn windows_cross_pages_and_end_with_the_list() {
        let (items, next) = read_window(0, 2, |r| list(5, r)).await.unwrap();
        assert_eq!((items, next), (vec![0, 1], Some(2)));
        let (items, next) = read_window(2, usize::MAX, |r| list(5, r)).await.unwrap();
        assert_eq!((items, next), (vec![2, 3, 4], None));
        let (items, next) = read_window(199, 3, |r| list(450, r)).await.unwrap();
        assert_eq!((items, next), (vec![199, 200, 201], Some(202)));
        let (items, next) = read_window(9, 3, |r| list(5, r)).await.unwrap();
        assert_eq!((items, next), (vec![], None));
    }
}
