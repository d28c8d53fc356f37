-- Functions every quota script starts with (the limiter sends this file, then the script).
-- Times are integer microseconds of Redis' clock (exact in a double up to 2^53); numbers go back into
-- Redis through string.format, because Lua's tostring keeps only 14 digits.
if redis.replicate_commands then redis.replicate_commands() end  -- Redis < 5: allows writes after TIME
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- GCRA: the key holds the theoretical arrival time (TAT). A request is admitted while TAT - now <= tolerance, the
-- (burst - 1) intervals the TAT may run ahead of now; the account quota passes none (a burst of one: upstream
-- providers count arrivals), the key limits (burst - 1) x interval (a burst of N requests per minute).
local function rate_wait(key, now, tolerance)  -- microseconds until the next admission (<= 0: now)
  return tonumber(redis.call('GET', key) or '0') - now - (tolerance or 0)
end
local function rate_take(key, now, interval)  -- after rate_wait admitted: the TAT moves on by one interval
  local tat = math.max(tonumber(redis.call('GET', key) or '0'), now) + interval
  redis.call('SET', key, string.format('%d', tat), 'PX', math.ceil((tat - now) / 1000) + 1000)
end
local function bucket_level(key, capacity, now)
  local state = redis.call('HMGET', key, 'level', 'at')
  if not state[1] then return capacity end
  return math.min(capacity, tonumber(state[1]) + (now - tonumber(state[2])) * capacity / 60000000)
end
local function bucket_store(key, capacity, level, now)
  redis.call('HSET', key, 'level', string.format('%.17g', level), 'at', string.format('%d', now))
  redis.call('PEXPIRE', key, math.ceil((capacity - level) * 60000 / capacity) + 1000)
end
