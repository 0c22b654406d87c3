-- _dlq_index.lua: not a script. scripts.py pastes it where a script says
-- '-- @include _dlq_index', so every script that adds or removes a DLQ entry keeps the
-- DLQ's indexes in step in the same atomic step (G5: the size and the counts an operator
-- reads are the entries that are there).
--
-- The indexes, for an entry <id> of task <task> with reason <reason> at <at_ms>:
--   time index  (zset)  <id> scored by at_ms: size, age-based purge, "is it in the DLQ?"
--   lex index   (zset, every score 0) four members, each ending in <inv>US<id>, where
--               US is the unit separator \31 and <inv> = 9999999999999 - at_ms,
--               zero-padded to 13 digits, so that byte order is newest first:
--                 'a' US <inv> US <id>                      every entry
--                 't' US <task> US <inv> US <id>            by task
--                 'r' US <reason> US <inv> US <id>          by reason
--                 'p' US <reason> US <task> US <inv> US <id>  by reason and task
--               A page is one ZRANGEBYLEX from a cursor: O(log N + page), at any depth.
--   counts      (hash)  't' US <task>, 'r' US <reason>, 'p' US <reason> US <task> -> count
local US = '\31'

local function dlq_members(id, task, reason, at_ms)
  local tail = US .. string.format('%013d', 9999999999999 - tonumber(at_ms)) .. US .. id
  return {
    'a' .. tail,
    't' .. US .. task .. tail,
    'r' .. US .. reason .. tail,
    'p' .. US .. reason .. US .. task .. tail,
  }
end

local function dlq_count_fields(task, reason)
  return {'t' .. US .. task, 'r' .. US .. reason, 'p' .. US .. reason .. US .. task}
end

local function dlq_index_add(time_key, lex_key, counts_key, id, task, reason, at_ms)
  redis.call('ZADD', time_key, at_ms, id)
  for _, member in ipairs(dlq_members(id, task, reason, at_ms)) do
    redis.call('ZADD', lex_key, 0, member)
  end
  for _, field in ipairs(dlq_count_fields(task, reason)) do
    redis.call('HINCRBY', counts_key, field, 1)
  end
end

-- Removes what dlq_index_add added for the entry as its hash records it (task,
-- reason, at_ms). Returns false, touching nothing, when the id is not in the index.
local function dlq_index_remove(time_key, lex_key, counts_key, entry_key, id)
  if redis.call('ZREM', time_key, id) == 0 then
    return false
  end
  local f = redis.call('HMGET', entry_key, 'task', 'reason', 'at_ms')
  local task, reason, at_ms = f[1] or '', f[2] or '', f[3] or '0'
  redis.call('ZREM', lex_key, unpack(dlq_members(id, task, reason, at_ms)))
  for _, field in ipairs(dlq_count_fields(task, reason)) do
    if redis.call('HINCRBY', counts_key, field, -1) <= 0 then
      redis.call('HDEL', counts_key, field)
    end
  end
  return true
end
