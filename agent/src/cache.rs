//! The node-local image cache's bookkeeping (book: "Node-Local Image Cache"): what is cached, how big,
//! when each image was last mounted, and eviction — LRU by last mount time (the largest first among
//! equally old ones), from the high watermark down to the low one, never an image a running allocation
//! has mounted (pinned) nor one an administrator made sticky. The index is `metadata.json` in the cache
//! directory, rewritten atomically, so a restarted agent keeps its cache; images on disk that the index
//! does not know are adopted (their size read, last use unknown = oldest).

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Eviction limits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    /// Bytes the cache may hold (`None`: unlimited, nothing is evicted).
    pub capacity: Option<u64>,
    /// Eviction starts above this fraction of the capacity (the seed: 90 %)...
    pub high: f64,
    /// ...and stops at or below this one (70 %).
    pub low: f64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            capacity: None,
            high: 0.9,
            low: 0.7,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub size: u64,
    /// Wall-clock milliseconds of its last mount (0: unknown).
    pub last_used_ms: u64,
    /// Never evicted (an administrator's base images).
    #[serde(default)]
    pub sticky: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct Index {
    images: BTreeMap<String, Entry>,
}

/// Counters for the agent's metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Stats {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    /// Pulls refused because eviction could not make room (every image pinned or sticky).
    pub full: u64,
}

/// The cache directory's images (`DIR/NAME.squashfs`, with `NAME.squashfs.sha256` beside each).
#[derive(Debug)]
pub struct ImageCache {
    dir: PathBuf,
    limits: Limits,
    index: Index,
    pub stats: Stats,
}

/// Eviction could not bring the cache under its limit for a new image.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("image cache full: {needed} bytes needed, {free} free after evicting every unpinned image")]
pub struct CacheFull {
    pub needed: u64,
    pub free: u64,
}

impl ImageCache {
    /// Opens the cache in `dir` (created when missing), reading its index and adopting unindexed images.
    pub fn open(dir: &Path, limits: Limits) -> ImageCache {
        let _ = std::fs::create_dir_all(dir);
        let index: Index = std::fs::read(dir.join("metadata.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let mut c = ImageCache {
            dir: dir.to_path_buf(),
            limits,
            index,
            stats: Stats::default(),
        };
        // What the disk holds is the truth: forget vanished images, adopt unknown ones.
        c.index.images.retain(|name, _| dir.join(name).is_file());
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.ends_with(".squashfs") && !c.index.images.contains_key(&name) {
                    let size = e.metadata().map_or(0, |m| m.len());
                    c.index.images.insert(
                        name,
                        Entry {
                            size,
                            ..Entry::default()
                        },
                    );
                }
            }
        }
        c.save();
        c
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Bytes held by cached images.
    pub fn used(&self) -> u64 {
        self.index.images.values().map(|e| e.size).sum()
    }

    pub fn entries(&self) -> &BTreeMap<String, Entry> {
        &self.index.images
    }

    /// An image was used from the cache (a hit) or pulled into it (a miss) at `now_ms`.
    pub fn used_image(&mut self, name: &str, hit: bool, now_ms: u64) {
        if hit {
            self.stats.hits += 1;
        } else {
            self.stats.misses += 1;
        }
        let size = std::fs::metadata(self.dir.join(name)).map_or(0, |m| m.len());
        let e = self.index.images.entry(name.to_string()).or_default();
        e.size = size;
        e.last_used_ms = now_ms;
        self.save();
    }

    /// Marks an image sticky (never evicted) or not.
    pub fn set_sticky(&mut self, name: &str, sticky: bool) {
        if let Some(e) = self.index.images.get_mut(name) {
            e.sticky = sticky;
            self.save();
        }
    }

    /// Makes room for `incoming` more bytes: when the cache would go above its high watermark, evicts
    /// least-recently-used images (largest first among equally old ones) that are neither pinned nor
    /// sticky until it is at or below the low watermark with them. Returns the evicted names, or
    /// [`CacheFull`] (nothing evicted) when even evicting every candidate leaves no room.
    pub fn make_room(&mut self, incoming: u64, pinned: &BTreeSet<String>) -> Result<Vec<String>, CacheFull> {
        let Some(cap) = self.limits.capacity else {
            return Ok(Vec::new());
        };
        let used = self.used();
        if (used + incoming) as f64 <= self.limits.high * cap as f64 {
            return Ok(Vec::new());
        }
        let target = (self.limits.low * cap as f64) as u64;
        let mut candidates: Vec<(&String, &Entry)> = self
            .index
            .images
            .iter()
            .filter(|(n, e)| !e.sticky && !pinned.contains(*n))
            .collect();
        candidates.sort_by(|a, b| {
            a.1.last_used_ms
                .cmp(&b.1.last_used_ms)
                .then(b.1.size.cmp(&a.1.size))
                .then(a.0.cmp(b.0))
        });
        let evictable: u64 = candidates.iter().map(|c| c.1.size).sum();
        if used - evictable + incoming > cap {
            self.stats.full += 1;
            return Err(CacheFull {
                needed: incoming,
                free: cap.saturating_sub(used - evictable),
            });
        }
        let mut left = used;
        let mut victims = Vec::new();
        for (name, e) in candidates {
            if left + incoming <= target {
                break;
            }
            left -= e.size;
            victims.push(name.clone());
        }
        for v in &victims {
            self.remove(v);
            self.stats.evictions += 1;
        }
        Ok(victims)
    }

    /// Removes an image (and its recorded digest) from the cache; refused while pinned.
    pub fn evict(&mut self, name: &str, pinned: &BTreeSet<String>) -> bool {
        if pinned.contains(name) || !self.index.images.contains_key(name) {
            return false;
        }
        self.remove(name);
        self.stats.evictions += 1;
        true
    }

    fn remove(&mut self, name: &str) {
        let _ = std::fs::remove_file(self.dir.join(name));
        let _ = std::fs::remove_file(self.dir.join(format!("{name}.sha256")));
        self.index.images.remove(name);
        self.save();
    }

    fn save(&self) {
        let tmp = self.dir.join("metadata.json.tmp");
        if let Ok(bytes) = serde_json::to_vec_pretty(&self.index)
            && std::fs::write(&tmp, bytes).is_ok()
        {
            let _ = std::fs::rename(&tmp, self.dir.join("metadata.json"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("lattice-cache-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn put(c: &mut ImageCache, name: &str, size: usize, at: u64) {
        std::fs::write(c.dir().join(name), vec![0u8; size]).unwrap();
        std::fs::write(c.dir().join(format!("{name}.sha256")), "x").unwrap();
        c.used_image(name, false, at);
    }

    #[test]
    fn eviction_goes_lru_from_high_to_low_and_spares_pins_and_sticky_images() {
        let d = dir("lru");
        let limits = Limits {
            capacity: Some(1000),
            high: 0.9,
            low: 0.7,
        };
        let mut c = ImageCache::open(&d, limits);
        put(&mut c, "a.squashfs", 200, 1);
        put(&mut c, "b.squashfs", 200, 2);
        put(&mut c, "c.squashfs", 200, 3);
        put(&mut c, "d.squashfs", 200, 4);
        c.set_sticky("b.squashfs", true);
        // 800 + 50 stays under 900: nothing goes.
        assert_eq!(c.make_room(50, &BTreeSet::new()), Ok(vec![]));
        // 800 + 200 > 900: evict down to 700 with the newcomer, oldest first; a (oldest) is pinned,
        // b is sticky, so c then d go.
        let pinned: BTreeSet<String> = ["a.squashfs".to_string()].into();
        assert_eq!(
            c.make_room(200, &pinned),
            Ok(vec!["c.squashfs".to_string(), "d.squashfs".to_string()])
        );
        assert!(!d.join("c.squashfs").exists() && !d.join("c.squashfs.sha256").exists());
        assert_eq!(c.used(), 400);
        assert_eq!(c.stats.evictions, 2);
        // Everything left is pinned or sticky: a big image cannot fit and nothing is evicted.
        let e = c.make_room(700, &pinned).unwrap_err();
        assert_eq!(e.free, 600);
        assert_eq!(c.used(), 400);
        assert_eq!(c.stats.full, 1);
        // An explicit eviction is refused while pinned.
        assert!(!c.evict("a.squashfs", &pinned));
        assert!(c.evict("a.squashfs", &BTreeSet::new()));
        // The index survives a restart; images the index does not know are adopted.
        std::fs::write(d.join("e.squashfs"), vec![0u8; 10]).unwrap();
        let c2 = ImageCache::open(&d, limits);
        assert_eq!(
            c2.entries().keys().cloned().collect::<Vec<_>>(),
            vec!["b.squashfs", "e.squashfs"]
        );
        assert!(c2.entries()["b.squashfs"].sticky);
        assert_eq!(c2.entries()["e.squashfs"].last_used_ms, 0);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn equally_old_images_go_largest_first_and_no_capacity_evicts_nothing() {
        let d = dir("size");
        let mut c = ImageCache::open(
            &d,
            Limits {
                capacity: Some(1000),
                ..Limits::default()
            },
        );
        put(&mut c, "small.squashfs", 100, 5);
        put(&mut c, "big.squashfs", 500, 5);
        put(&mut c, "new.squashfs", 200, 9);
        assert_eq!(c.make_room(300, &BTreeSet::new()), Ok(vec!["big.squashfs".to_string()]));
        let mut unlimited = ImageCache::open(&d, Limits::default());
        assert_eq!(unlimited.make_room(1 << 40, &BTreeSet::new()), Ok(vec![]));
        let _ = std::fs::remove_dir_all(&d);
    }
}
