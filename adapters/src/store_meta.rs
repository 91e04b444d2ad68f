//! The log's database's small records (`meta` table: the vote, the committed index, the last
//! purged log id, the snapshot records), shared by the log store and the snapshot files.

// openraft's storage traits return its `StorageError` by value; the helpers here share that type.
#![allow(clippy::result_large_err)]

use openraft::{StorageError, StorageIOError};
use redb::{Database, ReadableDatabase, TableDefinition};
use serde::{Deserialize, Serialize};

type SE = StorageError<u64>;

pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

pub(crate) fn meta_get<T: for<'a> Deserialize<'a>>(db: &Database, key: &str) -> Result<Option<T>, SE> {
    let tx = db.begin_read().map_err(|e| StorageIOError::read(&e))?;
    let t = tx.open_table(META).map_err(|e| StorageIOError::read(&e))?;
    let Some(v) = t.get(key).map_err(|e| StorageIOError::read(&e))? else {
        return Ok(None);
    };
    serde_json::from_slice(v.value())
        .map(Some)
        .map_err(|e| StorageIOError::read(&e).into())
}

/// Removes `key` (no-op when absent).
pub(crate) fn meta_delete(db: &Database, key: &str) -> Result<(), SE> {
    let tx = db.begin_write().map_err(|e| StorageIOError::write(&e))?;
    {
        let mut t = tx.open_table(META).map_err(|e| StorageIOError::write(&e))?;
        t.remove(key).map_err(|e| StorageIOError::write(&e))?;
    }
    tx.commit().map_err(|e| StorageIOError::write(&e))?;
    Ok(())
}

pub(crate) fn meta_put<T: Serialize>(db: &Database, key: &str, value: &T) -> Result<(), SE> {
    let bytes = serde_json::to_vec(value).map_err(|e| StorageIOError::write(&e))?;
    let tx = db.begin_write().map_err(|e| StorageIOError::write(&e))?;
    {
        let mut t = tx.open_table(META).map_err(|e| StorageIOError::write(&e))?;
        t.insert(key, bytes.as_slice()).map_err(|e| StorageIOError::write(&e))?;
    }
    tx.commit().map_err(|e| StorageIOError::write(&e))?;
    Ok(())
}
