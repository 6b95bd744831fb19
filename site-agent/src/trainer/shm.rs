//! Tensors in shared memory: a file in the agent's shm directory that a
//! trainer names in a request, read into (or written from) the agent's
//! memory with one copy. Names are plain file names (no `/`, no leading
//! `.`), the file must be a regular file (not a symbolic link: it is opened
//! with `O_NOFOLLOW`) that already holds `offset + elements × size` bytes
//! and belongs to the user the request came from (the peer of the trainer
//! socket, from `SO_PEERCRED`; over TCP loopback, which carries no
//! credentials, the agent's own user): a trainer cannot have the agent
//! read or overwrite another user's file. The agent never creates or grows
//! a trainer's file.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::TrainerError;

#[cfg(target_endian = "big")]
compile_error!("the trainer API's tensors are little-endian; big-endian hosts are not supported");

/// Largest tensor a request may name: 2^28 values (1 GiB of f32), the
/// largest fragment the exchange carries.
pub const MAX_TENSOR_ELEMENTS: u64 = longhaul_core::scenario::MAX_EXCHANGE_ELEMENTS;
/// Longest file name.
pub const MAX_NAME_BYTES: usize = 255;

/// Not a symbolic link, and never blocking on open (a FIFO named as a
/// tensor would otherwise hold a thread until someone opened its other
/// end; it is then refused as not a regular file).
#[cfg(target_os = "linux")]
const NO_FOLLOW: i32 = nix::fcntl::OFlag::O_NOFOLLOW.bits() | nix::fcntl::OFlag::O_NONBLOCK.bits();
#[cfg(not(target_os = "linux"))]
const NO_FOLLOW: i32 = 0;

/// The agent's own user: whom a request over TCP loopback speaks for.
pub fn own_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Element types a tensor may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    F32,
    Bf16,
}

impl Dtype {
    pub fn size(self) -> u64 {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 => 2,
        }
    }
}

/// A tensor a request names, checked for its form (not yet for its file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorRef {
    pub name: String,
    pub offset: u64,
    pub dtype: Dtype,
    pub elements: u64,
}

impl TensorRef {
    /// The tensor `message` names, as the request field `field`.
    pub fn from_wire(
        message: Option<&longhaul_proto::v1::SharedTensor>,
        field: &'static str,
    ) -> Result<TensorRef, TrainerError> {
        use longhaul_proto::v1::TensorDtype;
        let invalid = |message: String| TrainerError::Invalid { field, message };
        let Some(message) = message else {
            return Err(invalid("is missing".into()));
        };
        let name = &message.name;
        if name.is_empty()
            || name.len() > MAX_NAME_BYTES
            || name.starts_with('.')
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        {
            return Err(invalid(format!(
                "name {:?} must be a plain file name of 1 to {MAX_NAME_BYTES} letters, digits, '.', '_' or '-', not starting with '.'",
                super::prefix(name)
            )));
        }
        let dtype = match TensorDtype::try_from(message.dtype) {
            Ok(TensorDtype::F32) => Dtype::F32,
            Ok(TensorDtype::Bf16) => Dtype::Bf16,
            _ => {
                return Err(invalid(format!(
                    "dtype {} is not one of F32 (1) or BF16 (2)",
                    message.dtype
                )));
            }
        };
        if !(1..=MAX_TENSOR_ELEMENTS).contains(&message.elements) {
            return Err(invalid(format!(
                "elements is {}; it must be between 1 and {MAX_TENSOR_ELEMENTS}",
                message.elements
            )));
        }
        Ok(TensorRef {
            name: name.clone(),
            offset: message.offset,
            dtype,
            elements: message.elements,
        })
    }

    fn bytes(&self) -> u64 {
        self.elements * self.dtype.size()
    }
}

/// The directory trainers' tensors live in.
#[derive(Debug, Clone)]
pub struct ShmDir {
    dir: PathBuf,
}

impl ShmDir {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    fn open(
        &self,
        tensor: &TensorRef,
        write: bool,
        field: &'static str,
        owner: u32,
    ) -> Result<File, TrainerError> {
        let path = self.dir.join(&tensor.name);
        let file = OpenOptions::new()
            .read(!write)
            .write(write)
            .custom_flags(NO_FOLLOW)
            .open(&path)
            .map_err(|error| TrainerError::Invalid {
                field,
                message: format!("cannot open {}: {error}", path.display()),
            })?;
        let meta = file.metadata().map_err(|error| TrainerError::Invalid {
            field,
            message: format!("cannot stat {}: {error}", path.display()),
        })?;
        if !meta.is_file() {
            return Err(TrainerError::Invalid {
                field,
                message: format!("{} is not a regular file", path.display()),
            });
        }
        if meta.uid() != owner {
            return Err(TrainerError::Invalid {
                field,
                message: format!(
                    "{} belongs to uid {}, not to the caller's uid {owner}: a trainer names only its own files",
                    path.display(),
                    meta.uid()
                ),
            });
        }
        let end = tensor.offset.checked_add(tensor.bytes());
        if end.is_none_or(|end| end > meta.len()) {
            return Err(TrainerError::Invalid {
                field,
                message: format!(
                    "{} holds {} bytes; {} {:?} values at offset {} need {}",
                    path.display(),
                    meta.len(),
                    tensor.elements,
                    tensor.dtype,
                    tensor.offset,
                    end.map_or_else(|| "more than 2^64".to_string(), |e| e.to_string()),
                ),
            });
        }
        Ok(file)
    }

    /// The tensor's values as f32 (bf16 widened exactly), from a file of
    /// user `owner`; a value that is not finite (a pseudo-gradient must
    /// be) is refused, naming its index.
    pub fn read(
        &self,
        tensor: &TensorRef,
        field: &'static str,
        owner: u32,
    ) -> Result<Vec<f32>, TrainerError> {
        self.read_into(tensor, field, Vec::new(), owner)
    }

    /// [`ShmDir::read`] into `buffer`'s memory when it has the tensor's
    /// size: a buffer used before is not faulted in page by page again,
    /// which halves the read of a large fragment. Read in [`PIECE_BYTES`]
    /// pieces, each checked for finiteness while it is in cache, by up to
    /// [`MAX_WORKERS`] threads for a tensor of at least
    /// [`PARALLEL_BYTES`] (one `pread` of a 1 GiB tmpfs file and a scalar
    /// check took 0.8–1.1 s here, against 0.13 s for a memcpy).
    pub fn read_into(
        &self,
        tensor: &TensorRef,
        field: &'static str,
        buffer: Vec<f32>,
        owner: u32,
    ) -> Result<Vec<f32>, TrainerError> {
        let file = self.open(tensor, false, field, owner)?;
        let n = tensor.elements as usize;
        let mut values = if buffer.len() == n {
            buffer
        } else {
            vec![0f32; n]
        };
        let dtype = tensor.dtype;
        let outcome = in_parallel(&mut values, tensor.bytes(), |first, part| {
            read_part(&file, tensor.offset, dtype, first, part)
        });
        match outcome {
            Err(error) => Err(TrainerError::Invalid {
                field,
                message: format!("cannot read {}: {error}", tensor.name),
            }),
            Ok(Some(at)) => Err(TrainerError::Invalid {
                field,
                message: format!("value {at} is {}: every value must be finite", values[at]),
            }),
            Ok(None) => Ok(values),
        }
    }

    /// Writes `values` into the tensor (bf16 rounded to nearest even), a
    /// file of user `owner`: by one thread (two writing one tmpfs file
    /// took 1.6 times as long as one here, probably on the file's lock),
    /// bf16 in pieces.
    pub fn write(
        &self,
        tensor: &TensorRef,
        values: &[f32],
        field: &'static str,
        owner: u32,
    ) -> Result<(), TrainerError> {
        if values.len() as u64 != tensor.elements {
            return Err(TrainerError::Invalid {
                field,
                message: format!(
                    "elements is {}; the result has {}",
                    tensor.elements,
                    values.len()
                ),
            });
        }
        let file = self.open(tensor, true, field, owner)?;
        let written = match tensor.dtype {
            Dtype::F32 => file.write_all_at(bytemuck::cast_slice(values), tensor.offset),
            Dtype::Bf16 => write_bf16(&file, tensor.offset, values),
        };
        written.map_err(|error| TrainerError::Invalid {
            field,
            message: format!("cannot write {}: {error}", tensor.name),
        })
    }
}

/// Bytes of one `pread`/`pwrite` of a tensor: small enough to be checked
/// while still in cache.
pub const PIECE_BYTES: usize = 1 << 20;
/// Tensors at least this large are read by several threads.
pub const PARALLEL_BYTES: u64 = 32 << 20;
/// Threads reading one tensor at most.
pub const MAX_WORKERS: usize = 4;

fn workers(bytes: u64) -> usize {
    if bytes < PARALLEL_BYTES {
        return 1;
    }
    std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_WORKERS))
}

fn panicked() -> std::io::Error {
    std::io::Error::other("a reading thread panicked")
}

/// Runs `part(first, values)` over `values` split into [`workers`] parts
/// (each on its own thread when there are several) and returns the
/// smallest index any part found not finite.
fn in_parallel(
    values: &mut [f32],
    bytes: u64,
    part: impl Fn(usize, &mut [f32]) -> std::io::Result<Option<usize>> + Sync,
) -> std::io::Result<Option<usize>> {
    let workers = workers(bytes);
    if workers == 1 {
        return part(0, values);
    }
    let per = values.len().div_ceil(workers).max(1);
    let part = &part;
    std::thread::scope(|scope| {
        let handles: Vec<_> = values
            .chunks_mut(per)
            .enumerate()
            .map(|(i, chunk)| scope.spawn(move || part(i * per, chunk)))
            .collect();
        let mut first = None;
        for handle in handles {
            if let Some(at) = handle.join().unwrap_or_else(|_| Err(panicked()))? {
                first = Some(first.map_or(at, |f: usize| f.min(at)));
            }
        }
        Ok(first)
    })
}

/// Reads `values` (the tensor's elements from `first` on) piece by piece
/// and returns the index of its first value that is not finite.
fn read_part(
    file: &File,
    offset: u64,
    dtype: Dtype,
    first: usize,
    values: &mut [f32],
) -> std::io::Result<Option<usize>> {
    let size = dtype.size() as usize;
    let per_piece = PIECE_BYTES / size;
    let mut halves = Vec::new();
    for (i, piece) in values.chunks_mut(per_piece).enumerate() {
        let start = first + i * per_piece;
        let at = offset + (start * size) as u64;
        match dtype {
            Dtype::F32 => file.read_exact_at(bytemuck::cast_slice_mut(piece), at)?,
            Dtype::Bf16 => {
                halves.resize(piece.len(), 0u16);
                file.read_exact_at(bytemuck::cast_slice_mut(&mut halves), at)?;
                for (value, half) in piece.iter_mut().zip(&halves) {
                    *value = f32::from_bits(u32::from(*half) << 16);
                }
            }
        }
        // Without an early exit, so that it vectorises.
        if !piece.iter().fold(true, |ok, v| ok & v.is_finite()) {
            return Ok(piece.iter().position(|v| !v.is_finite()).map(|p| start + p));
        }
    }
    Ok(None)
}

/// Writes `values` as bf16 at `offset`, a piece at a time.
fn write_bf16(file: &File, offset: u64, values: &[f32]) -> std::io::Result<()> {
    let per_piece = PIECE_BYTES / 2;
    let mut halves = Vec::with_capacity(per_piece.min(values.len()));
    for (i, piece) in values.chunks(per_piece).enumerate() {
        halves.clear();
        halves.extend(piece.iter().map(|v| bf16_bits(*v)));
        file.write_all_at(
            bytemuck::cast_slice(&halves),
            offset + (i * PIECE_BYTES) as u64,
        )?;
    }
    Ok(())
}

/// `value` rounded to the nearest bf16 (ties to even); NaN stays NaN.
fn bf16_bits(value: f32) -> u16 {
    let bits = value.to_bits();
    if value.is_nan() {
        return ((bits >> 16) as u16) | 0x40;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use longhaul_proto::v1 as pb;

    fn wire(name: &str, offset: u64, dtype: pb::TensorDtype, elements: u64) -> pb::SharedTensor {
        pb::SharedTensor {
            name: name.into(),
            offset,
            dtype: dtype as i32,
            elements,
        }
    }

    #[test]
    fn a_tensor_reference_is_checked_and_names_its_field() {
        for (tensor, needle) in [
            (wire("../etc/passwd", 0, pb::TensorDtype::F32, 4), "name"),
            (wire("a/b", 0, pb::TensorDtype::F32, 4), "name"),
            (wire(".hidden", 0, pb::TensorDtype::F32, 4), "name"),
            (wire("", 0, pb::TensorDtype::F32, 4), "name"),
            (wire("t", 0, pb::TensorDtype::Unspecified, 4), "dtype"),
            (wire("t", 0, pb::TensorDtype::F32, 0), "elements"),
            (
                wire("t", 0, pb::TensorDtype::F32, MAX_TENSOR_ELEMENTS + 1),
                "elements",
            ),
        ] {
            let error = TensorRef::from_wire(Some(&tensor), "tensor").unwrap_err();
            let text = error.to_string();
            assert!(text.starts_with("tensor: "), "{text}");
            assert!(text.contains(needle), "{text}");
        }
        assert!(TensorRef::from_wire(None, "into").is_err());
    }

    #[test]
    fn values_go_through_a_file_both_ways_in_both_dtypes() {
        let dir = tempfile::tempdir().unwrap();
        let shm = ShmDir::new(dir.path());
        let values: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) / 7.0).collect();
        std::fs::write(dir.path().join("t"), vec![0u8; 16 + 4000]).unwrap();
        let f32_at_16 = TensorRef {
            name: "t".into(),
            offset: 16,
            dtype: Dtype::F32,
            elements: 1000,
        };
        shm.write(&f32_at_16, &values, "into", own_uid()).unwrap();
        assert_eq!(shm.read(&f32_at_16, "tensor", own_uid()).unwrap(), values);
        let bf16 = TensorRef {
            dtype: Dtype::Bf16,
            offset: 0,
            ..f32_at_16.clone()
        };
        shm.write(&bf16, &values, "into", own_uid()).unwrap();
        let back = shm.read(&bf16, "tensor", own_uid()).unwrap();
        for (a, b) in values.iter().zip(&back) {
            assert!((a - b).abs() <= a.abs() / 256.0, "{a} {b}");
        }
        // Exact for values bf16 holds.
        assert_eq!(bf16_bits(1.5), 0x3fc0);
        assert_eq!(f32::from_bits(u32::from(bf16_bits(-2.0)) << 16), -2.0);
    }

    #[test]
    fn a_large_tensor_goes_through_in_parallel_pieces_and_a_value_not_finite_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let shm = ShmDir::new(dir.path());
        // Past the parallel threshold, and not a multiple of the pieces.
        let n = (PARALLEL_BYTES / 4) as usize + 12_345;
        std::fs::write(dir.path().join("t"), vec![0u8; 8 + 4 * n]).unwrap();
        // Every f32 value names its index; bf16 holds these exactly (and
        // neither piece size is a multiple of 251).
        let f32_values: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let bf16_values: Vec<f32> = (0..n).map(|i| (i % 251) as f32 - 125.0).collect();
        for (dtype, values) in [(Dtype::F32, &f32_values), (Dtype::Bf16, &bf16_values)] {
            let tensor = TensorRef {
                name: "t".into(),
                offset: 8,
                dtype,
                elements: n as u64,
            };
            shm.write(&tensor, values, "into", own_uid()).unwrap();
            assert_eq!(&shm.read(&tensor, "tensor", own_uid()).unwrap(), values);
            // Into a buffer used before, as submissions do.
            let back = shm
                .read_into(&tensor, "tensor", vec![1.0; n], own_uid())
                .unwrap();
            assert_eq!(&back, values);
        }
        // Not finite in two parts: the first index is named.
        let f32s = TensorRef {
            name: "t".into(),
            offset: 8,
            dtype: Dtype::F32,
            elements: n as u64,
        };
        let mut bad = f32_values.clone();
        bad[n - 1] = f32::NAN;
        bad[PIECE_BYTES / 4 + 3] = f32::INFINITY;
        shm.write(&f32s, &bad, "into", own_uid()).unwrap();
        let error = shm
            .read(&f32s, "tensor", own_uid())
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("tensor: ")
                && error.contains(&format!("value {} is inf", PIECE_BYTES / 4 + 3)),
            "{error}"
        );
        bad[PIECE_BYTES / 4 + 3] = 0.0;
        shm.write(&f32s, &bad, "into", own_uid()).unwrap();
        let error = shm
            .read(&f32s, "tensor", own_uid())
            .unwrap_err()
            .to_string();
        assert!(
            error.contains(&format!("value {} is NaN", n - 1)),
            "{error}"
        );
    }

    #[test]
    fn a_file_too_short_a_link_or_a_directory_is_refused_and_nothing_written() {
        let dir = tempfile::tempdir().unwrap();
        let shm = ShmDir::new(dir.path());
        std::fs::write(dir.path().join("short"), vec![7u8; 100]).unwrap();
        let tensor = TensorRef {
            name: "short".into(),
            offset: 0,
            dtype: Dtype::F32,
            elements: 26,
        };
        let error = shm
            .write(&tensor, &[0.0; 26], "into", own_uid())
            .unwrap_err();
        assert!(error.to_string().contains("holds 100 bytes"), "{error}");
        assert_eq!(
            std::fs::read(dir.path().join("short")).unwrap(),
            vec![7u8; 100]
        );
        let error = shm
            .read(
                &TensorRef {
                    offset: u64::MAX,
                    ..tensor.clone()
                },
                "tensor",
                own_uid(),
            )
            .unwrap_err();
        assert!(error.to_string().contains("2^64"), "{error}");
        std::os::unix::fs::symlink(dir.path().join("short"), dir.path().join("link")).unwrap();
        let link = TensorRef {
            name: "link".into(),
            elements: 1,
            ..tensor.clone()
        };
        assert!(shm.read(&link, "tensor", own_uid()).is_err());
        std::fs::create_dir(dir.path().join("d")).unwrap();
        let directory = TensorRef {
            name: "d".into(),
            ..link
        };
        assert!(shm.read(&directory, "tensor", own_uid()).is_err());
        // A FIFO is refused at once, not waited on.
        let fifo = dir.path().join("fifo");
        assert!(
            std::process::Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .unwrap()
                .success()
        );
        let error = shm
            .read(
                &TensorRef {
                    name: "fifo".into(),
                    ..tensor.clone()
                },
                "tensor",
                own_uid(),
            )
            .unwrap_err();
        assert!(error.to_string().contains("not a regular file"), "{error}");
        let missing = TensorRef {
            name: "missing".into(),
            ..tensor
        };
        assert!(
            shm.read(&missing, "tensor", own_uid())
                .unwrap_err()
                .to_string()
                .contains("cannot open")
        );
    }

    #[test]
    fn a_file_of_another_user_is_neither_read_nor_written() {
        let dir = tempfile::tempdir().unwrap();
        let shm = ShmDir::new(dir.path());
        std::fs::write(dir.path().join("theirs"), vec![7u8; 16]).unwrap();
        let tensor = TensorRef {
            name: "theirs".into(),
            offset: 0,
            dtype: Dtype::F32,
            elements: 4,
        };
        // The file is this process's; the caller is someone else.
        let caller = own_uid().wrapping_add(1);
        let error = shm.write(&tensor, &[1.0; 4], "into", caller).unwrap_err();
        assert!(
            error.to_string().starts_with("into: ")
                && error.to_string().contains(&format!(
                    "belongs to uid {}, not to the caller's uid {caller}",
                    own_uid()
                )),
            "{error}"
        );
        assert_eq!(
            std::fs::read(dir.path().join("theirs")).unwrap(),
            vec![7u8; 16]
        );
        let error = shm.read(&tensor, "tensor", caller).unwrap_err();
        assert!(error.to_string().contains("belongs to uid"), "{error}");
        assert_eq!(shm.read(&tensor, "tensor", own_uid()).unwrap().len(), 4);
    }
}
