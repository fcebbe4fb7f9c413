/* The .ekm file, version 1: ekrt's flat model format (docs/ekrt.md, "The .ekm file").
 *
 * Little-endian, every section 64-byte aligned, all offsets from the start of the file.
 * These structs are read with memcpy from a byte buffer (never cast in place), so they
 * carry no alignment requirement on the caller's buffer. */
#ifndef EDGEKIT_EKM_H
#define EDGEKIT_EKM_H

#include <stdint.h>

#define EKM_MAGIC "EKM1"
#define EKM_VERSION 1u
#define EKM_ALIGN 64u
#define EKM_MAX_RANK 4
#define EKM_MAX_OP_INPUTS 8
#define EKM_N_PARAMS 20

enum ekm_dtype { EKM_F32 = 1, EKM_I8 = 2, EKM_I32 = 3 };
enum ekm_storage { EKM_ARENA = 1, EKM_CONST = 2, EKM_IO = 3 };

enum ekm_op_type {
  EKM_QUANTIZE = 1,
  EKM_DEQUANTIZE = 2,
  EKM_CONV2D = 3,
  EKM_FULLY_CONNECTED = 4,
  EKM_ADD = 5,
  EKM_MUL = 6,
  EKM_CONCAT = 7,
  EKM_MAXPOOL = 8,
  EKM_AVGPOOL = 9,
  EKM_GLOBAL_AVGPOOL = 10,
  EKM_RESHAPE = 11,
  EKM_TRANSPOSE = 12,
  EKM_RESIZE = 13,
  EKM_LUT = 14,
  EKM_SOFTMAX = 15,
  EKM_PAD = 16,         /* added in place: files with ops 1..15 load as before */
  EKM_SLICE = 17,
  EKM_LUT_CHANNEL = 18,
  EKM_F_BINARY = 19,    /* the float ops of the islands (docs/ekrt.md "Float islands") */
  EKM_F_UNARY = 20,
  EKM_F_REDUCE = 21,
  EKM_F_MATMUL = 22,
  EKM_F_SOFTMAX = 23,
  EKM_OP_LAST = 23
};

struct ekm_header {            /* 128 bytes */
  char magic[4];               /* "EKM1" */
  uint32_t version;            /* EKM_VERSION */
  uint32_t header_size;        /* 128 */
  uint32_t flags;              /* 0 */
  uint64_t file_size;          /* must equal the real size */
  uint32_t checksum;           /* CRC-32 (zlib's) of bytes [header_size, file_size) */
  uint32_t n_tensors, n_ops, n_inputs, n_outputs;
  uint32_t reserved0;
  uint64_t tensors_offset;     /* n_tensors * struct ekm_tensor */
  uint64_t ops_offset;         /* n_ops * struct ekm_op, in execution order */
  uint64_t io_offset;          /* (n_inputs + n_outputs) * struct ekm_io: inputs first */
  uint64_t data_offset;        /* constant data + strings */
  uint64_t data_size;
  uint64_t arena_size;         /* scratch bytes for all non-constant tensors */
  uint8_t reserved[32];
};

struct ekm_tensor {            /* 48 bytes */
  uint32_t dtype;              /* enum ekm_dtype */
  uint32_t storage;            /* enum ekm_storage; arena and const tensors may be float32 (islands) */
  uint32_t rank;               /* 0..4 */
  uint32_t dims[4];            /* logical dims (>= 1); unused trailing dims are 0 */
  float scale;                 /* int8 only (> 0, finite); 0 otherwise */
  int32_t zero_point;          /* int8 only (-128..127); 0 otherwise */
  uint32_t reserved;           /* 0 */
  uint64_t offset;             /* arena offset / offset into data / 0 for io */
};

struct ekm_io {                /* 16 bytes */
  uint32_t tensor;             /* an io (storage 3) float32 tensor */
  uint32_t name_length;        /* 1..1024 */
  uint64_t name_offset;        /* relative to data_offset; UTF-8, not NUL-terminated */
};

struct ekm_op {                /* 128 bytes */
  uint32_t type;               /* enum ekm_op_type */
  uint32_t n_inputs;           /* 0..8; unused slots are 0 */
  uint32_t inputs[8];
  uint32_t n_outputs;          /* 1 */
  uint32_t outputs[1];
  int32_t params[20];          /* per op (docs/ekrt.md); unused = 0 */
};

#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
_Static_assert(sizeof(struct ekm_header) == 128, "ekm_header is 128 bytes");
_Static_assert(sizeof(struct ekm_tensor) == 48, "ekm_tensor is 48 bytes");
_Static_assert(sizeof(struct ekm_io) == 16, "ekm_io is 16 bytes");
_Static_assert(sizeof(struct ekm_op) == 128, "ekm_op is 128 bytes");
#endif

#endif /* EDGEKIT_EKM_H */
