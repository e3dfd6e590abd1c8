//! A read-only view of a store that recovery and the writer can still
//! "repair": every read goes to the real files, every change (truncate,
//! write, create, rename, remove, fdatasync) stays in memory and is lost
//! when the view is dropped. A reshape opens the old store through it, so
//! the old store's files are never modified (they stay byte for byte what
//! they were: the way back), while its recovery decides exactly as at a
//! normal start and the copy is made from the repaired view.
//!
//! Invariants:
//! - Nothing is ever written through the inner storage: it is called for
//!   `list` and `open_read` only.
//! - A path has at most one [`OverlayFile`]: every open of it shares the
//!   handle, so a change made through one handle (recovery truncating a
//!   tail) is seen through every other (the writer appending after it).
//! - A file's bytes are copied into memory only when it is first changed
//!   (a torn tail, a quarantine patch, a segment the writer appends to, a
//!   checkpoint): memory is bounded by what is changed, not by the store.
//! - `sync_data` and `sync_dir` succeed without doing anything: nothing
//!   in the view is durable, by design; it is never the store in use.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::storage::{Storage, StorageFile};

/// See the module documentation.
pub struct OverlayStorage {
    inner: Arc<dyn Storage>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Every file opened or created through the view, by path.
    files: BTreeMap<PathBuf, Arc<OverlayFile>>,
    /// Real files removed or renamed away in the view.
    hidden: BTreeSet<PathBuf>,
    /// Directories created in the view only.
    dirs: BTreeSet<PathBuf>,
}

struct OverlayFile {
    /// The real file (read only), if the path existed.
    real: Option<Arc<dyn StorageFile>>,
    /// The bytes once changed in the view.
    changed: Mutex<Option<Vec<u8>>>,
}

impl OverlayFile {
    /// The file's bytes in memory, copied from the real file first time.
    fn with_bytes<T>(&self, f: impl FnOnce(&mut Vec<u8>) -> T) -> io::Result<T> {
        let mut changed = self.changed.lock();
        if changed.is_none() {
            let bytes = match &self.real {
                None => Vec::new(),
                Some(r) => {
                    let len = usize::try_from(r.len()?).map_err(io::Error::other)?;
                    let mut b = vec![0u8; len];
                    r.read_exact_at(&mut b, 0)?;
                    b
                }
            };
            *changed = Some(bytes);
        }
        Ok(f(changed.as_mut().expect("just filled")))
    }
}

fn offset(at: u64) -> io::Result<usize> {
    usize::try_from(at).map_err(io::Error::other)
}

impl StorageFile for OverlayFile {
    fn read_exact_at(&self, buf: &mut [u8], at: u64) -> io::Result<()> {
        if let Some(bytes) = self.changed.lock().as_ref() {
            let start = offset(at)?;
            let end = start.checked_add(buf.len()).filter(|e| *e <= bytes.len());
            let Some(end) = end else {
                return Err(io::ErrorKind::UnexpectedEof.into());
            };
            buf.copy_from_slice(&bytes[start..end]);
            return Ok(());
        }
        match &self.real {
            Some(r) => r.read_exact_at(buf, at),
            None => Err(io::ErrorKind::UnexpectedEof.into()),
        }
    }
    fn write_all_at(&self, buf: &[u8], at: u64) -> io::Result<()> {
        let start = offset(at)?;
        self.with_bytes(|b| {
            if b.len() < start + buf.len() {
                b.resize(start + buf.len(), 0);
            }
            b[start..start + buf.len()].copy_from_slice(buf);
        })
    }
    fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }
    fn len(&self) -> io::Result<u64> {
        if let Some(bytes) = self.changed.lock().as_ref() {
            return Ok(bytes.len() as u64);
        }
        self.real.as_ref().map_or(Ok(0), |r| r.len())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        let len = offset(len)?;
        self.with_bytes(|b| b.resize(len, 0))
    }
}

impl OverlayStorage {
    pub fn new(inner: Arc<dyn Storage>) -> OverlayStorage {
        OverlayStorage {
            inner,
            state: Mutex::new(State::default()),
        }
    }

    /// The one handle of `path`, opening the real file on first use.
    fn handle(&self, path: &Path) -> io::Result<Arc<OverlayFile>> {
        let mut st = self.state.lock();
        if let Some(f) = st.files.get(path) {
            return Ok(Arc::clone(f));
        }
        if st.hidden.contains(path) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} was removed (in the read-only view)", path.display()),
            ));
        }
        let f = Arc::new(OverlayFile {
            real: Some(self.inner.open_read(path)?),
            changed: Mutex::new(None),
        });
        st.files.insert(path.to_path_buf(), Arc::clone(&f));
        Ok(f)
    }
}

impl Storage for OverlayStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        match self.inner.list(dir) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.state.lock().dirs.insert(dir.to_path_buf());
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let st = self.state.lock();
        let mut names: BTreeSet<String> = match self.inner.list(dir) {
            Ok(n) => n
                .into_iter()
                .filter(|n| !st.hidden.contains(&dir.join(n)))
                .collect(),
            Err(e) if e.kind() == io::ErrorKind::NotFound && st.dirs.contains(dir) => {
                BTreeSet::new()
            }
            Err(e) => return Err(e),
        };
        for p in st.files.keys() {
            if p.parent() == Some(dir) {
                if let Some(n) = p.file_name().and_then(|n| n.to_str()) {
                    names.insert(n.to_owned());
                }
            }
        }
        Ok(names.into_iter().collect())
    }
    fn create(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        let f = Arc::new(OverlayFile {
            real: None,
            changed: Mutex::new(Some(Vec::new())),
        });
        self.state
            .lock()
            .files
            .insert(path.to_path_buf(), Arc::clone(&f));
        Ok(f)
    }
    fn open(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        Ok(self.handle(path)?)
    }
    fn open_read(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        Ok(self.handle(path)?)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let f = self.handle(from)?;
        let mut st = self.state.lock();
        st.files.remove(from);
        st.hidden.insert(from.to_path_buf());
        st.files.insert(to.to_path_buf(), f);
        Ok(())
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        // NotFound if it is not there, as a real remove would say.
        self.handle(path)?;
        let mut st = self.state.lock();
        st.files.remove(path);
        st.hidden.insert(path.to_path_buf());
        Ok(())
    }
    fn remove_dir(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        st.dirs.remove(dir);
        st.hidden.insert(dir.to_path_buf());
        Ok(())
    }
    fn sync_dir(&self, _dir: &Path) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::FaultStorage;

    #[test]
    fn changes_stay_in_the_view_and_the_real_files_keep_their_bytes() {
        let real = FaultStorage::new(1);
        real.create_dir_all(Path::new("/d")).unwrap();
        let f = real.create(Path::new("/d/a")).unwrap();
        f.write_all_at(b"hello world", 0).unwrap();
        f.sync_data().unwrap();
        real.sync_dir(Path::new("/d")).unwrap();
        let view = OverlayStorage::new(Arc::new(real.clone()));

        let a = view.open(Path::new("/d/a")).unwrap();
        a.set_len(5).unwrap();
        a.write_all_at(b"!", 5).unwrap();
        let again = view.open_read(Path::new("/d/a")).unwrap();
        let mut buf = [0u8; 6];
        again.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"hello!", "every handle of a path sees the change");
        view.create(Path::new("/d/b")).unwrap();
        view.rename(Path::new("/d/b"), Path::new("/d/c")).unwrap();
        view.remove(Path::new("/d/a")).unwrap();
        assert_eq!(view.list(Path::new("/d")).unwrap(), vec!["c".to_owned()]);

        assert_eq!(real.contents(Path::new("/d/a")).unwrap(), b"hello world");
        assert_eq!(real.list(Path::new("/d")).unwrap(), vec!["a".to_owned()]);
    }
}
