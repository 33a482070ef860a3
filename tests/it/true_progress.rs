//! The bytes a partial file holds, as `status` and `gc` count them: the
//! durable ranges of its record, never its length. A download in ranged
//! parts writes each part at its offset, so its file is as long as its
//! furthest write long before it holds that much.

use std::io::{Seek, SeekFrom, Write};
use std::path::PathBuf;

use gem_resources::partial::PartialMeta;
use gem_resources::registry::Registry;
use gem_resources::store::gc::{self, Kind};
use gem_resources::{ResourceState, Resources, Store};
use serde_json::json;

use crate::support::*;

const SIZE: usize = 4 << 20;
const PIECE: u64 = 256 << 10;

/// Writes `ranges` of `body` at their offsets into its partial file in the
/// store, as parts of a download leave it (a sparse file as long as the
/// last range's end), and, with `record`, the record that says they are
/// durable, as `url` sent them. Returns the data file's path.
fn write_partial(
    env: &Env,
    url: &url::Url,
    body: &[u8],
    ranges: &[[u64; 2]],
    record: bool,
) -> PathBuf {
    let name = format!("{}.{}.partial", sha256_hex(body), body.len());
    let data = store_root(env).join("tmp").join(&name);
    let mut file = std::fs::File::create(&data).unwrap();
    for &[start, end] in ranges {
        file.seek(SeekFrom::Start(start)).unwrap();
        file.write_all(&body[start as usize..end as usize]).unwrap();
    }
    file.sync_all().unwrap();
    if record {
        let (durable, rest) = match ranges.split_first() {
            Some((&[0, end], rest)) => (end, rest.to_vec()),
            _ => (0, ranges.to_vec()),
        };
        let meta = PartialMeta {
            address: url.to_string(),
            validator: Some("\"p1\"".into()),
            durable,
            ranges: rest,
        };
        let record = store_root(env).join("tmp").join(format!("{name}.json"));
        std::fs::write(record, serde_json::to_vec(&meta).unwrap()).unwrap();
    }
    data
}

/// The state and kept bytes `status` gives gem `g`'s only resource.
fn row(service: &Resources) -> (ResourceState, Option<u64>) {
    let status = service.status(Some("g")).unwrap();
    let r = &status[0].resources[0];
    (r.state.clone(), r.partial_bytes)
}

#[tokio::test]
async fn status_counts_the_durable_ranges_of_a_download_another_process_holds() {
    let env = Env::new().await;
    let body = bytes(SIZE, 151);
    let url = env.url("origin.test", "/parts.bin");
    let service = Resources::open(&env.config()).unwrap();
    service
        .install("g", &manifest(json!([entry("m", &url, &body)])))
        .await
        .unwrap();
    // The first part and one far ahead are durable: half a MiB held, in a
    // file 3.25 MiB long.
    let ranges = [[0, PIECE], [3 << 20, (3 << 20) + PIECE]];
    let data = write_partial(&env, &url, &body, &ranges, true);
    let len = std::fs::metadata(&data).unwrap().len();
    assert_eq!(len, (3 << 20) + PIECE);
    // Another process (here another store handle) holds the download.
    let other = Store::open(&env.store_dir()).unwrap();
    let held = other.try_lock(&sha256_hex(&body)).unwrap().unwrap();
    let (state, _) = row(&service);
    assert!(
        matches!(state, ResourceState::Downloading { bytes, .. } if bytes == 2 * PIECE),
        "{state:?}: the durable ranges, not the length {len}"
    );
    // Once it lets go, the same bytes are what a resume keeps.
    drop(held);
    assert_eq!(row(&service), (ResourceState::Missing, Some(2 * PIECE)));
    service.shutdown().await;
}

#[tokio::test]
async fn gc_counts_partial_files_by_what_they_hold() {
    let env = Env::new().await;
    let (recorded, unrecorded) = (bytes(SIZE, 152), bytes(SIZE, 153));
    let url = env.url("origin.test", "/gone.bin");
    let service = Resources::open(&env.config()).unwrap();
    let ranges = [[0, PIECE], [3 << 20, (3 << 20) + PIECE]];
    let with_record = write_partial(&env, &url, &recorded, &ranges, true);
    let without = write_partial(&env, &url, &unrecorded, &ranges, false);
    let registry = Registry::new(service.store());
    let found = gc::undeclared(service.store(), &registry).unwrap();
    let bytes_of = |sha: &str| {
        let item = found
            .iter()
            .find(|u| u.sha256 == sha && u.kind == Kind::Partial)
            .unwrap_or_else(|| panic!("{found:?}"));
        item.bytes
    };
    let len = std::fs::metadata(&with_record).unwrap().len();
    let record_len = std::fs::metadata(with_record.with_extension("partial.json"))
        .unwrap()
        .len();
    // The durable ranges and the record beside them.
    let counted = bytes_of(&sha256_hex(&recorded));
    assert!(
        (2 * PIECE..=2 * PIECE + record_len).contains(&counted),
        "{counted} of a file {len} long"
    );
    // Without a record, the blocks the file occupies: where the file
    // system keeps the gap unwritten, far less than its length.
    let counted = bytes_of(&sha256_hex(&unrecorded));
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let blocks = std::fs::metadata(&without).unwrap().blocks() * 512;
        assert!(
            blocks < len,
            "the file system wrote the gap: {blocks} of {len}"
        );
        assert_eq!(counted, blocks.min(len));
    }
    #[cfg(not(unix))]
    assert_eq!(counted, std::fs::metadata(&without).unwrap().len());
    service.shutdown().await;
}
