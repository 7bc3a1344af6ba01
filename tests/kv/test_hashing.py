import struct

import pytest
import xxhash

from dynask.kv.hashing import (
    DEFAULT_SEED,
    BlockHashPair,
    LocalBlockHash,
    SequenceHash,
    block_hashes,
    chain_hash,
    hash_seed,
    local_block_hash,
    local_block_hashes,
    pack_token_ids,
    packed_block_hashes,
    unpack_token_ids,
)


def xxh(data: bytes, seed: int = 1337) -> int:
    return xxhash.xxh3_64_intdigest(data, seed=seed)


def test_default_seed_is_dynamo_router_seed():
    assert DEFAULT_SEED == 1337


def test_hash_seed_without_extra_keys_is_default():
    assert hash_seed(None) == 1337
    assert hash_seed([]) == 1337


def test_hash_seed_hashes_nul_joined_utf8_keys():
    assert hash_seed(["lora-a"]) == xxh(b"lora-a")
    assert hash_seed(["lora-a", "salt-é"]) == xxh("lora-a\x00salt-é".encode())


def test_hash_seed_differs_per_adapter():
    assert hash_seed(["lora-a"]) != hash_seed(["lora-b"])


def test_local_block_hash_packs_little_endian_u32():
    assert local_block_hash([1, 2, 3, 4]) == xxh(struct.pack("<4I", 1, 2, 3, 4))
    assert local_block_hash([1, 2, 3, 4]) == xxh(b"\x01\0\0\0\x02\0\0\0\x03\0\0\0\x04\0\0\0")


def test_local_block_hash_uses_seed():
    assert local_block_hash([7, 8], seed=42) == xxh(struct.pack("<2I", 7, 8), seed=42)


def test_local_block_hash_accepts_u32_max():
    assert local_block_hash([0xFFFFFFFF]) == xxh(b"\xff\xff\xff\xff")


@pytest.mark.parametrize("bad", [-1, 2**32])
def test_local_block_hash_rejects_tokens_outside_u32(bad):
    with pytest.raises(ValueError, match=rf"token_ids\[1\] has value {bad}"):
        local_block_hash([5, bad])


def test_chain_hash_first_block_is_local():
    assert chain_hash(None, LocalBlockHash(123)) == 123


def test_chain_hash_packs_parent_then_local_as_u64():
    expected = xxh(struct.pack("<QQ", 11, 22))
    assert chain_hash(SequenceHash(11), LocalBlockHash(22)) == expected
    assert chain_hash(SequenceHash(11), LocalBlockHash(22), seed=9) == xxh(
        struct.pack("<QQ", 11, 22), seed=9
    )


def test_block_hashes_chains_full_blocks():
    local_0 = xxh(struct.pack("<4I", 1, 2, 3, 4))
    local_1 = xxh(struct.pack("<4I", 5, 6, 7, 8))
    seq_1 = xxh(struct.pack("<QQ", local_0, local_1))
    assert block_hashes([1, 2, 3, 4, 5, 6, 7, 8], block_size=4) == [
        BlockHashPair(local=LocalBlockHash(local_0), sequence=SequenceHash(local_0)),
        BlockHashPair(local=LocalBlockHash(local_1), sequence=SequenceHash(seq_1)),
    ]


def test_block_hashes_skips_trailing_partial_block():
    full = block_hashes([1, 2, 3, 4, 5, 6, 7, 8], block_size=4)
    assert block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], block_size=4) == full
    assert block_hashes([1, 2, 3], block_size=4) == []
    assert block_hashes([], block_size=4) == []


def test_same_block_after_different_prefix_gets_different_sequence_hash():
    a = block_hashes([1, 2, 9, 9], block_size=2)
    b = block_hashes([3, 4, 9, 9], block_size=2)
    assert a[1].local == b[1].local
    assert a[1].sequence != b[1].sequence


def test_extra_keys_change_every_hash():
    tokens = [1, 2, 3, 4]
    seed = hash_seed(["lora-a"])
    salted = block_hashes(tokens, block_size=2, seed=seed)
    assert salted[0].local == xxh(struct.pack("<2I", 1, 2), seed=seed)
    assert salted[1].sequence == xxh(
        struct.pack("<QQ", salted[0].sequence, salted[1].local), seed=seed
    )
    assert {p.sequence for p in salted}.isdisjoint(
        p.sequence for p in block_hashes(tokens, block_size=2)
    )


@pytest.mark.parametrize("bad", [0, -4])
def test_block_hashes_rejects_non_positive_block_size(bad):
    with pytest.raises(ValueError, match=f"block_size must be positive, got {bad}"):
        block_hashes([1, 2, 3], block_size=bad)


def test_local_block_hashes_are_each_full_blocks_local_hash():
    tokens = [1, 2, 3, 4, 5, 6, 0xFFFFFFFF]  # two full blocks of 3, one token left over

    hashes = local_block_hashes(tokens, block_size=3)

    assert hashes == [xxh(struct.pack("<3I", 1, 2, 3)), xxh(struct.pack("<3I", 4, 5, 6))]
    assert hashes == [local_block_hash([1, 2, 3]), local_block_hash([4, 5, 6])]


def test_local_block_hashes_equal_block_by_block_hashing_for_a_long_prompt():
    tokens = [(i * 2_654_435_761) % 49_152 for i in range(20_000)]  # 312 full blocks of 64
    seed = hash_seed(["lora-a"])

    hashes = local_block_hashes(tokens, block_size=64, seed=seed)

    assert len(hashes) == 312
    assert hashes == [local_block_hash(tokens[s : s + 64], seed) for s in range(0, 19_968, 64)]
    assert hashes[0] == xxh(struct.pack("<64I", *tokens[:64]), seed=seed)


def test_local_block_hashes_of_a_tuple_and_of_too_few_tokens():
    assert local_block_hashes((7, 8), block_size=2, seed=42) == [xxh(struct.pack("<2I", 7, 8), 42)]
    assert local_block_hashes([7], block_size=2) == []
    assert local_block_hashes([], block_size=2) == []


@pytest.mark.parametrize("bad", [-1, 2**32])
def test_local_block_hashes_reject_tokens_outside_u32_as_local_block_hash_does(bad):
    with pytest.raises(ValueError, match=rf"token_ids\[3\] has value {bad}"):
        local_block_hashes([5, 6, 7, bad], block_size=2)


def test_local_block_hashes_ignore_a_bad_token_in_the_partial_block():
    assert local_block_hashes([5, 6, -1], block_size=2) == [local_block_hash([5, 6])]


@pytest.mark.parametrize("bad", [0, -4])
def test_local_block_hashes_reject_non_positive_block_size(bad):
    with pytest.raises(ValueError, match=f"block_size must be positive, got {bad}"):
        local_block_hashes([1, 2, 3], block_size=bad)


def test_pack_token_ids_is_little_endian_u32_and_unpacks_back():
    packed = pack_token_ids([1, 258, 0xFFFFFFFF])

    assert packed == b"\x01\0\0\0\x02\x01\0\0\xff\xff\xff\xff"
    assert unpack_token_ids(packed) == (1, 258, 0xFFFFFFFF)
    assert pack_token_ids(()) == b"" and unpack_token_ids(b"") == ()


@pytest.mark.parametrize("bad", [-1, 2**32])
def test_pack_token_ids_names_a_token_outside_u32(bad):
    with pytest.raises(ValueError, match=rf"token_ids\[2\] has value {bad}"):
        pack_token_ids([5, 6, bad])


def test_unpack_token_ids_refuses_a_length_not_a_multiple_of_four():
    with pytest.raises(ValueError, match="packed token ids have 6 bytes; expected a multiple of 4"):
        unpack_token_ids(b"\x01\0\0\0\x02\0")


def test_packed_block_hashes_equal_local_block_hashes_of_the_ints():
    tokens = [(i * 2_654_435_761) % 49_152 for i in range(20_000)]  # 312 full blocks of 64
    seed = hash_seed(["lora-a"])

    hashes = packed_block_hashes(pack_token_ids(tokens), block_size=64, seed=seed)

    assert hashes == local_block_hashes(tokens, block_size=64, seed=seed)
    assert hashes[0] == xxh(struct.pack("<64I", *tokens[:64]), seed=seed)
    assert packed_block_hashes(pack_token_ids([1, 2, 3]), 2) == [xxh(struct.pack("<2I", 1, 2))]
    assert packed_block_hashes(b"", 2) == []
